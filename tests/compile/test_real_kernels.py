"""Real kernels nobody on the project wrote (benchmarks/kernels: CuPy's cupyx RawModule sources,
CCCL's CUB NVRTC test kernel), through compile_program: every miss and every hit is the bytes of
a plain cuda.core Program.compile of the same request; a fresh process hits every kernel another
compiled (not one compile, twice over in that process); and a real edit of one header misses, in
a fresh process, exactly the kernels that read it. Samples here (every 9th CuPy kernel and one
deep one; fewer for the processes); benchmarks/bench_real_kernels.py runs all 183."""

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


def test_misses_and_hits_are_plain_compiles_bytes(tmp_path, bundled) -> None:
    sample = corpus.kernels(bundled, deep=False)[::9] + corpus.kernels(bundled, deep=True)[4:5]
    assert len(sample) >= 20 and sum(k.deep for k in sample) == 1
    cache = FileStreamProgramCache(tmp_path / "cache")
    wrong = []
    for kernel in sample:
        plain = corpus.plain_compile(kernel)
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
        if [i.hit for i in infos] != [False, True] or not all(corpus.same_code(g, plain) for g in got):
            wrong.append((kernel.name, [i.hit for i in infos], [len(g) for g in got], len(plain)))
        assert not kernel.deep or len(infos[0].headers) > 300, kernel.name
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
    args = [corpus.KERNELS, str(tmp_path / "cache"), bundled, include, json.dumps(picks), str(passes)]
    return json.loads(run_python(CHILD, *args, timeout=600).strip().splitlines()[-1])


def _picks(bundled: str) -> list[int]:
    every = corpus.kernels(bundled)
    cupy = [i for i, k in enumerate(every) if not k.deep]
    return cupy[::24] + [next(i for i, k in enumerate(every) if k.deep)]


def test_a_fresh_process_hits_every_kernel_another_compiled(tmp_path, bundled) -> None:
    """Cold in one process, then a fresh one twice over the same kernels: not one compile, every
    call a hit (the first pass proves the headers by stat, the second trusts what it watched)."""
    picks = _picks(bundled)
    cold = _process(tmp_path, bundled, picks)
    assert cold["compiles"] == len(picks) and not any(c["hit"] for c in cold["calls"])
    warm = _process(tmp_path, bundled, picks, passes=2)
    assert warm["compiles"] == 0
    assert [c["hit"] for c in warm["calls"]] == [True] * (2 * len(picks))


def test_an_edit_of_one_header_misses_exactly_the_kernels_that_read_it(tmp_path, bundled) -> None:
    """One of CuPy's headers, read by some of the sample and not by others, gets a real edit (its
    text changes): a fresh process compiles again exactly those that read it, the others hit."""
    picks = _picks(bundled)
    cold = _process(tmp_path, bundled, picks)
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
