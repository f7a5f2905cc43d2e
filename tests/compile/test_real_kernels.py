"""Real kernels nobody on the project wrote (benchmarks/kernels: CuPy's cupyx RawModule sources,
CCCL's CUB NVRTC test kernel), through compile_program: every miss and every hit is the bytes of
a plain cuda.core Program.compile of the same request; a fresh process hits every kernel another
compiled (not one compile, twice over in that process); and a real edit of one header misses, in
a fresh process, exactly the kernels that read it. Samples here (every 9th CuPy kernel and one
deep one, compiled once per module; every 24th CuPy kernel for the edit); benchmarks/
bench_real_kernels.py runs all 183."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap

import pytest
from cuda.core import ProgramOptions
from helpers import REPO, run_python, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program


def _load_corpus():  # noqa: ANN202 - the module
    # Loaded by path, not by putting benchmarks/kernels on sys.path: its vendored cupy/ folder
    # would then be found as a `cupy` namespace package by every later test in this process.
    import importlib.util

    spec = importlib.util.spec_from_file_location("corpus", os.path.join(REPO, "benchmarks", "kernels", "corpus.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["corpus"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


corpus = _load_corpus()


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> str:
    try:
        return corpus.bundled_headers(str(tmp_path_factory.mktemp("bundled")))
    except RuntimeError as exc:
        pytest.skip(str(exc))


def _sample(bundled: str) -> list[int]:
    """Indices into corpus.kernels: every 9th CuPy kernel and one deep (CUB) kernel."""
    every = corpus.kernels(bundled)
    cupy = [i for i, k in enumerate(every) if not k.deep]
    deep = [i for i, k in enumerate(every) if k.deep]
    return cupy[::9] + deep[4:5]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, bundled) -> dict:
    """The sample through compile_program twice in this process, into one cache, beside a plain
    compile of each: (cache root, picks, per kernel (name, deep, infos, codes, plain code)).
    Shared by the tests that read it (none changes the cache or a header): the CUB kernel, the
    slowest of the sample (a plain compile and a miss of ~700 headers), is compiled once here."""
    root = str(tmp_path_factory.mktemp("compiled") / "cache")
    picks = _sample(bundled)
    every = corpus.kernels(bundled)
    cache = FileStreamProgramCache(root)
    out, dropped = [], []
    for i in list(picks):
        kernel = every[i]
        try:
            plain = corpus.plain_compile(kernel)
        except Exception as exc:
            # A toolkit named by $CORPUS_TOOLKIT_INCLUDE (an NVRTC without bundled headers, the
            # H200 host's CUDA 13.0) can have an older CCCL than the vendored CUB kernel needs:
            # a plain compile fails there, so the sample runs without it. Not with NVRTC's own.
            if not (kernel.deep and os.environ.get(corpus.HEADERS_ENV) and "cannot open source file" in str(exc)):
                raise
            picks.remove(i)
            dropped.append(kernel.name)
            continue
        infos = [CompileInfo(), CompileInfo()]
        got = [
            bytes(
                compile_program(
                    kernel.code,
                    cache=cache,
                    options=ProgramOptions(**kernel.options),
                    name_expressions=kernel.name_expressions,
                    info=info,
                ).code
            )
            for info in infos
        ]
        out.append((kernel.name, kernel.deep, infos, got, plain))
    cache.close()
    return {"root": root, "picks": picks, "kernels": out, "dropped": dropped}


def test_misses_and_hits_are_plain_compiles_bytes(compiled) -> None:
    kernels = compiled["kernels"]
    dropped = len(compiled["dropped"])  # the CUB kernel, where a toolkit's CCCL cannot compile it
    assert len(kernels) + dropped >= 20 and sum(deep for _, deep, *_ in kernels) == 1 - dropped
    wrong = []
    for name, deep, infos, got, plain in kernels:
        if [i.hit for i in infos] != [False, True] or not all(corpus.same_code(g, plain) for g in got):
            wrong.append((name, [i.hit for i in infos], [len(g) for g in got], len(plain)))
        assert not deep or len(infos[0].headers) > 300, name
    assert wrong == []


# A fresh process: the kernels ``picks`` (indices into corpus.kernels) through compile_program,
# ``passes`` times over, with CuPy's include directory replaced by ``include`` (a copy a test may edit).
CHILD = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    kernels_dir, root, bundled, include, picks, passes = sys.argv[1:7]
    sys.path.insert(0, kernels_dir)
    import corpus
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
    chosen = [corpus.kernels(bundled)[i] for i in json.loads(picks)]
    cache = FileStreamProgramCache(root)
    before = cache.stats()["compiles"]
    calls = []
    for _ in range(int(passes)):
        for k in chosen:
            options = dict(k.options)
            options["include_path"] = [include if p.endswith("cupy/include") else p for p in options["include_path"]]
            info = CompileInfo()
            compile_program(k.code, cache=cache, options=ProgramOptions(**options),
                            name_expressions=k.name_expressions, info=info)
            calls.append({"hit": info.hit, "headers": info.headers})
    print(json.dumps({"compiles": cache.stats()["compiles"] - before, "calls": calls}))
    """
)


def _process(tmp_path, bundled: str, picks: list[int], passes: int = 1) -> dict:
    include = str(tmp_path / "include")
    if not os.path.isdir(include):
        shutil.copytree(os.path.join(corpus.KERNELS, "cupy", "include"), include)
        settle_timestamps()
    return _child(str(tmp_path / "cache"), bundled, include, picks, passes)


def _child(root: str, bundled: str, include: str, picks: list[int], passes: int) -> dict:
    args = [corpus.KERNELS, root, bundled, include, json.dumps(picks), str(passes)]
    return json.loads(run_python(CHILD, *args, timeout=600).strip().splitlines()[-1])


def test_a_fresh_process_hits_every_kernel_another_compiled(compiled, bundled) -> None:
    """Compiled in this process (the CUB kernel among them), then a fresh process twice over the
    same kernels: not one compile, every call a hit (the first pass proves the headers by stat,
    the second trusts what it watched)."""
    picks = compiled["picks"]
    assert all(not infos[0].hit for _, _, infos, _, _ in compiled["kernels"])  # each compiled here, cold
    cupy_include = os.path.join(corpus.KERNELS, "cupy", "include")  # the very paths compiled above
    warm = _child(compiled["root"], bundled, cupy_include, picks, passes=2)
    assert warm["compiles"] == 0
    assert [c["hit"] for c in warm["calls"]] == [True] * (2 * len(picks))


def test_an_edit_of_one_header_misses_exactly_the_kernels_that_read_it(tmp_path, bundled) -> None:
    """One of CuPy's headers, read by some of the sample and not by others, gets a real edit (its
    text changes): a fresh process compiles again exactly those that read it, the others hit.
    CuPy kernels only (every 24th): the CUB kernel reads no header of the copy."""
    every = corpus.kernels(bundled)
    picks = [i for i, k in enumerate(every) if not k.deep][::24]
    cold = _process(tmp_path, bundled, picks)
    assert cold["compiles"] == len(picks) and not any(c["hit"] for c in cold["calls"])
    include = str(tmp_path / "include") + os.sep
    read = [{h for h in c["headers"] if h.startswith(include)} for c in cold["calls"]]
    shared = sorted(set().union(*read) - set.intersection(*read))
    assert shared, "no header of the copy is read by some of the sample and not by the others"
    # The header that splits the sample most evenly (CuPy kernels on both sides, where one does).
    edited = min(shared, key=lambda h: abs(sum(h in r for r in read) - len(read) / 2))
    with open(edited, "a") as f:
        f.write("\n// edited\n")
    settle_timestamps()
    warm = _process(tmp_path, bundled, picks)
    expected = [edited not in r for r in read]
    assert [c["hit"] for c in warm["calls"]] == expected
    assert warm["compiles"] == expected.count(False) > 0 and expected.count(True) > 0
