"""Strict mode (KERNELCACHE_REQUIRE_HIT) and explained misses (the source index), with real compiles."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, SUPPORT, run_python, settle_timestamps, support_script

import kernelcache
from kernelcache import (
    CacheMissError,
    CompileInfo,
    CompileManyError,
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    compile_many,
    compile_program,
)
from kernelcache.config import ConfigError, check, require_hit

SRC = 'extern "C" __global__ void fill(float* a) { a[threadIdx.x] = N; }\n'
TEMPLATE = "template <typename T> __global__ void axpy(T a, T* x) { x[threadIdx.x] *= a; }\n"


def _opts(**kw: object) -> ProgramOptions:
    return ProgramOptions(**{"arch": ARCH, **kw})


def _compiles(cache: object) -> int:
    return int(cache.stats().get("compiles", 0))  # type: ignore[attr-defined]


def test_cache_miss_error_is_public_and_a_runtime_error() -> None:
    assert "CacheMissError" in kernelcache.__all__
    assert issubclass(CacheMissError, RuntimeError)


def test_require_hit_on_an_empty_cache_raises_and_compiles_nothing(tmp_path, monkeypatch) -> None:
    cache = FileStreamProgramCache(str(tmp_path))
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    with pytest.raises(CacheMissError) as caught:
        compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache)
    assert caught.value.explanation == "no entry for this source"
    assert _compiles(cache) == 0 and len(cache) == 0


def test_the_error_names_the_kernel_and_how_to_fill_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    cache = FileStreamProgramCache(str(tmp_path))
    with pytest.raises(CacheMissError, match=rf"a cache miss for fill \(c\+\+ -> cubin for {ARCH}\)") as caught:
        compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache)
    assert "KERNELCACHE_RECORD" in str(caught.value) and "kernelcache warm" in str(caught.value)
    with pytest.raises(CacheMissError, match=r"axpy<float> \("):
        compile_program(TEMPLATE, options=_opts(), name_expressions=["axpy<float>"], cache=cache)
    assert _compiles(cache) == 0


def test_a_source_index_holding_a_key_that_is_not_hex_never_fails_a_compile(tmp_path) -> None:
    # A record that passes its checksum (another writer's, an unsigned shared store's) with a
    # key that is not hex made every miss of that source raise ValueError from the explanation.
    cache = FileStreamProgramCache(str(tmp_path))
    compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache)
    (index,) = [e for e in cache.iter_entries() if ((e.meta or {}).get("meta") or {}).get("kind") == "source-index"]
    payload = json.dumps({"format": 1, "entries": [{"key": "not-hex", "components": {}}]}).encode()
    assert cache.write_named(index.name, payload, index.meta["meta"])
    info = CompileInfo()
    compile_program(SRC, options=_opts(define_macro="N=8"), cache=cache, info=info)
    assert not info.hit and info.miss_reason == "no entry for this source" and _compiles(cache) == 2


def test_explanation_names_the_define_macro_and_both_values(tmp_path, monkeypatch, caplog) -> None:
    cache = FileStreamProgramCache(str(tmp_path))
    first = CompileInfo()
    compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache, info=first)
    assert first.miss_reason == "no entry for this source"
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    hit = CompileInfo()
    compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache, info=hit)
    assert hit.hit and hit.miss_reason is None
    with caplog.at_level(logging.INFO, logger="kernelcache"), pytest.raises(CacheMissError) as caught:
        compile_program(SRC, options=_opts(define_macro="N=8"), cache=cache)
    text = caught.value.explanation
    assert "options.define_macro" in text and "['N=4']" in text and "['N=8']" in text, text
    assert first.entry_name[:16] in text  # the nearest entry, by the name `ls` prints
    assert "options.arch" not in text  # only what differs
    assert [r.getMessage() for r in caplog.records if text in r.getMessage()]  # logged at INFO
    assert _compiles(cache) == 1


def test_miss_reason_without_strict_mode_and_the_arch(tmp_path) -> None:
    cache = InMemoryProgramCache()
    compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache)
    info = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch="sm_80", define_macro="N=4"), cache=cache, info=info)
    assert not info.hit
    assert info.miss_reason is not None
    assert f"options.arch: cached '{ARCH}', this call 'sm_80'" in info.miss_reason, info.miss_reason


def test_explanation_names_a_name_expression(tmp_path) -> None:
    cache = FileStreamProgramCache(str(tmp_path))
    compile_program(TEMPLATE, options=_opts(), cache=cache, name_expressions=("axpy<float>",))
    info = CompileInfo()
    compile_program(TEMPLATE, options=_opts(), cache=cache, name_expressions=("axpy<double>",), info=info)
    assert "name_expressions: cached ['axpy<float>'], this call ['axpy<double>']" in (info.miss_reason or "")


def test_explanation_names_a_changed_header_and_its_path(tmp_path, monkeypatch) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    header = inc / "scale.cuh"
    header.write_text("#define SCALE 2.0f\n")
    settle_timestamps()
    src = '#include "scale.cuh"\nextern "C" __global__ void k(float* a) { a[0] = SCALE; }\n'
    cache = FileStreamProgramCache(str(tmp_path / "cache"))
    opts = _opts(include_path=[str(inc)])
    compile_program(src, options=opts, cache=cache)
    header.write_text("#define SCALE 3.0f\n")
    settle_timestamps()
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    with pytest.raises(CacheMissError) as caught:
        compile_program(src, options=opts, cache=cache)
    assert f"changed header {header}" in caught.value.explanation, caught.value.explanation


def test_warn_mode_compiles_with_one_warning_per_miss(tmp_path, monkeypatch) -> None:
    cache = FileStreamProgramCache(str(tmp_path))
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "warn")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compile_program(SRC, options=_opts(define_macro="N=1"), cache=cache)
        compile_program(SRC, options=_opts(define_macro="N=1"), cache=cache)  # a hit: no warning
        compile_program(SRC, options=_opts(define_macro="N=2"), cache=cache)
    misses = [w for w in seen if issubclass(w.category, KernelCacheWarning)]
    assert len(misses) == 2, [str(w.message) for w in seen]
    assert "no entry for this source" in str(misses[0].message)
    assert "['N=1']" in str(misses[1].message) and "['N=2']" in str(misses[1].message)
    assert misses[0].filename == __file__  # pointed at the caller's line
    assert _compiles(cache) == 2


def test_require_hit_with_the_cache_disabled_raises(monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    with pytest.raises(CacheMissError, match="KERNELCACHE_DISABLE"):
        compile_program(SRC, options=_opts(define_macro="N=4"))


def test_compile_many_reports_each_strict_miss_as_that_request_error(tmp_path, monkeypatch) -> None:
    cache = FileStreamProgramCache(str(tmp_path))
    compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache)
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    requests = [{"code": SRC, "options": _opts(define_macro=f"N={n}")} for n in (4, 5)]
    with pytest.raises(CompileManyError) as caught:
        compile_many(requests, cache=cache, max_workers=2)
    assert set(caught.value.errors) == {1} and caught.value.results[0] is not None
    assert isinstance(caught.value.errors[1], CacheMissError)
    assert _compiles(cache) == 1


@pytest.mark.parametrize("value", ["2", "maybe", "raise"])
def test_a_bad_require_hit_value_names_the_variable(monkeypatch, value) -> None:
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", value)
    with pytest.raises(ConfigError, match="KERNELCACHE_REQUIRE_HIT"):
        require_hit()
    with pytest.raises(ConfigError, match="KERNELCACHE_REQUIRE_HIT"):
        check()


@pytest.mark.parametrize(
    ("value", "mode"), [("1", "raise"), ("yes", "raise"), ("WARN", "warn"), ("0", None), ("", None)]
)
def test_require_hit_values(monkeypatch, value, mode) -> None:
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", value)
    assert require_hit() == mode


class _ReadCounting(InMemoryProgramCache):
    """A real in-memory store that also notes the key of every read (get_many reads through _read too)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[bytes] = []

    def _read(self, key: bytes):  # type: ignore[no-untyped-def]
        self.reads.append(key)
        return super()._read(key)


def test_a_hit_never_reads_the_source_index() -> None:
    from kernelcache.compile.lookup import Lookup
    from kernelcache.compile.request import CompileRequest
    from kernelcache.compile.sourceindex import index_key

    cache = _ReadCounting()
    for n in (1, 2):  # two keys of one source: the index holds both
        compile_program(SRC, options=_opts(define_macro=f"N={n}"), cache=cache)
    look = Lookup(cache, CompileRequest.of(SRC, options=_opts(define_macro="N=1")))
    assert len(json.loads(cache.get_record(index_key(look))[0])["entries"]) == 2
    del cache.reads[:]
    info = CompileInfo()
    compile_program(SRC, options=_opts(define_macro="N=1"), cache=cache, info=info)
    assert info.hit
    assert cache.reads == [info.key]  # exactly one read: the entry itself
    del cache.reads[:]
    compile_program(SRC, options=_opts(define_macro="N=3"), cache=cache)  # a miss reads the index
    assert index_key(look) in cache.reads


HIT_CHILD = textwrap.dedent(
    """
    import json, os, sys
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

    root = os.path.realpath(sys.argv[1])
    src = 'extern "C" __global__ void fill(float* a) { a[threadIdx.x] = N; }\\n'
    cache = FileStreamProgramCache(root)
    opened = []
    sys.addaudithook(lambda event, args: opened.append(os.path.relpath(str(args[0]), root))
                     if event == "open" and str(args[0]).startswith(root) else None)
    info = CompileInfo()
    compile_program(src, options=ProgramOptions(arch=sys.argv[2], define_macro="N=1"), cache=cache, info=info)
    print(json.dumps({"hit": info.hit, "name": info.entry_name, "opened": opened}))
    """
)


def test_a_hit_in_a_fresh_process_opens_the_entry_and_nothing_else(tmp_path) -> None:
    root = str(tmp_path)
    cache = FileStreamProgramCache(root)
    for n in (1, 2):
        compile_program(SRC, options=_opts(define_macro=f"N={n}"), cache=cache)
    names = {os.path.basename(p) for p in (str(e.path) for e in cache.iter_entries())}
    assert len(names) == 3  # two artifacts and the source index
    proc = subprocess.run([sys.executable, "-c", HIT_CHILD, root, ARCH], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hit"]
    entry = os.path.join("v2", "entries", out["name"][:2], out["name"])
    assert out["opened"] == [entry, entry + ".meta"], out["opened"]


def test_the_source_index_travels_through_redis(server, monkeypatch) -> None:
    from kernelcache import RedisProgramCache

    url = server.url
    with RedisProgramCache(url, namespace="strict-index") as cache:
        compile_program(SRC, options=_opts(define_macro="N=4"), cache=cache)
    code = textwrap.dedent(
        f"""
        from cuda.core import ProgramOptions
        from kernelcache import CacheMissError, RedisProgramCache, compile_program
        with RedisProgramCache({url!r}, namespace="strict-index") as cache:
            try:
                compile_program({SRC!r}, options=ProgramOptions(arch={ARCH!r}, define_macro="N=9"), cache=cache)
            except CacheMissError as exc:
                print(exc.explanation)
        """
    )
    out = run_python(code, env={"KERNELCACHE_REQUIRE_HIT": "1"})
    assert "options.define_macro: cached ['N=4'], this call ['N=9']" in out, out


INDEX_CHILD = textwrap.dedent(
    """
    import sys
    from cuda.core import ProgramOptions
    from kernelcache import FileStreamProgramCache, compile_program
    sys.path.insert(0, sys.argv[5])
    from startline import arrive
    arrive(sys.argv[3], 4)
    src = 'extern "C" __global__ void fill(float* a) { a[threadIdx.x] = N; }\\n'
    compile_program(src, options=ProgramOptions(arch=sys.argv[2], define_macro="N=" + sys.argv[4]),
                    cache=FileStreamProgramCache(sys.argv[1]))
    """
)


def test_processes_storing_one_source_under_different_options_all_reach_its_index(tmp_path) -> None:
    # The race: each process reads the index, adds its key, writes it back. Started together
    # (startline: all go once all have imported), their read-merge-writes overlap unless the index
    # lock orders them.
    from kernelcache.compile.lookup import Lookup
    from kernelcache.compile.request import CompileRequest
    from kernelcache.compile.sourceindex import index_key

    root, gate = str(tmp_path / "cache"), str(tmp_path / "gate")
    procs = [
        subprocess.Popen([sys.executable, "-c", INDEX_CHILD, root, ARCH, gate, str(n), SUPPORT], stderr=subprocess.PIPE)
        for n in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read() if p.stderr else ""
    cache = FileStreamProgramCache(root)
    look = Lookup(cache, CompileRequest.of(SRC, options=_opts(define_macro="N=0")))
    entries = json.loads(cache.get_record(index_key(look))[0])["entries"]
    macros = sorted(e["components"]["options.define_macro"] for e in entries)
    assert macros == ["['N=0']", "['N=1']", "['N=2']", "['N=3']"]  # as the key sees them


def test_a_triton_miss_raises_under_require_hit(monkeypatch) -> None:
    pytest.importorskip("triton")
    from kernelcache.triton import KernelCacheManager

    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "1")
    with pytest.raises(CacheMissError, match="Triton's add_kernel") as caught:
        KernelCacheManager("b" * 52).get_group("add_kernel.json")  # Triton's look-up before it compiles
    assert "b" * 52 in caught.value.explanation
    monkeypatch.setenv("KERNELCACHE_REQUIRE_HIT", "warn")
    with pytest.warns(KernelCacheWarning, match="add_kernel"):
        assert KernelCacheManager("b" * 52).get_group("add_kernel.json") is None


def test_a_real_triton_compile_under_require_hit_raises_then_hits_once_warm(tmp_path) -> None:
    pytest.importorskip("triton")
    worker = support_script("_triton_worker.py")
    env = dict(
        os.environ,
        KERNELCACHE_DIR=str(tmp_path / "kc"),
        TRITON_CACHE_MANAGER="kernelcache.triton:KernelCacheManager",
        TRITON_CACHE_DIR=str(tmp_path / "triton-own"),
    )

    def compile_(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, worker, "compile"], env={**env, **extra}, capture_output=True, text=True, timeout=300
        )

    cold = compile_(KERNELCACHE_REQUIRE_HIT="1")
    assert cold.returncode != 0 and "CacheMissError" in cold.stderr, cold.stderr
    assert compile_().returncode == 0  # the real run that fills the cache
    warm = compile_(KERNELCACHE_REQUIRE_HIT="1")
    assert warm.returncode == 0, warm.stderr
    assert json.loads(warm.stdout.strip().splitlines()[-1])["compiled"] == 0


def test_an_older_near_copy_of_the_index_never_drops_a_key_a_shared_tier_holds(tmp_path) -> None:
    from kernelcache import TieredProgramCache
    from kernelcache.compile.lookup import Lookup
    from kernelcache.compile.request import CompileRequest
    from kernelcache.compile.sourceindex import index_key

    shared = str(tmp_path / "shared")
    tiered = TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(shared)])
    compile_program(SRC, options=_opts(define_macro="N=1"), cache=tiered)  # both tiers: [N=1]
    compile_program(SRC, options=_opts(define_macro="N=2"), cache=FileStreamProgramCache(shared))  # a peer
    info = CompileInfo()
    compile_program(SRC, options=_opts(define_macro="N=3"), cache=tiered, info=info)
    assert "['N=2']" in (info.miss_reason or "") or "['N=1']" in (info.miss_reason or "")
    look = Lookup(tiered, CompileRequest.of(SRC, options=_opts(define_macro="N=0")))
    for tier in tiered.tiers:
        entries = json.loads(tier.get_record(index_key(look))[0])["entries"]
        assert sorted(e["components"]["options.define_macro"] for e in entries) == ["['N=1']", "['N=2']", "['N=3']"]


def test_require_hit_from_the_config_file_applies_to_a_call_with_its_own_cache(tmp_path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('require_hit = "1"\n')
    code = textwrap.dedent(
        f"""
        from cuda.core import ProgramOptions
        from kernelcache import CacheMissError, InMemoryProgramCache, compile_program
        try:
            compile_program({SRC!r}, options=ProgramOptions(arch={ARCH!r}, define_macro="N=1"),
                            cache=InMemoryProgramCache())
            print("compiled")
        except CacheMissError as exc:
            print("raised:", exc.explanation)
        """
    )
    out = run_python(code, env={"KERNELCACHE_CONFIG": str(config)})  # nothing reads the default cache
    assert out.strip() == "raised: no entry for this source", out


def test_nothing_of_a_miss_outlives_the_call_so_its_directory_can_go_at_once(tmp_path) -> None:
    # A miss writes the entry, its sidecar and the source's index: all of it must be done when
    # compile_program returns (a write left running, say on another thread to take it off the
    # miss's cost, would race with removing the directory right then: an rmtree failing
    # "Directory not empty", or files written again into a directory the caller removed).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(12):
            root = tmp_path / f"c{n}"
            info = CompileInfo()
            compile_program(
                SRC + f"// {n}\n", options=_opts(define_macro="N=1"), cache=FileStreamProgramCache(root), info=info
            )
            assert info.cached
            shutil.rmtree(root)  # no ignore_errors: a file appearing meanwhile fails it
        time.sleep(0.1)
        assert sorted(p.name for p in tmp_path.iterdir()) == []
    # A write still running would have failed into the removed directory: one warning saying so.
    assert [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)] == []
    # And the index did reach the store: a second arch of one source is explained against the first.
    cache = FileStreamProgramCache(tmp_path / "kept")
    compile_program(SRC, options=_opts(define_macro="N=1"), cache=cache)
    info = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch="sm_80", define_macro="N=1"), cache=cache, info=info)
    assert info.miss_reason is not None and "differs in options.arch" in info.miss_reason, info.miss_reason
