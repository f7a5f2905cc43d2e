"""compile_program with the real NVRTC on a CPU-only machine (no GPU needed)."""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import threading
import warnings

import _workers as w
import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, mounted_tmpfs, settle_timestamps
from sources import HEAVY, TEMPLATE, TRIVIAL, WARNS, needs_bundled_headers

from kernelcache import (
    CompileInfo,
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    compile_program,
)
from kernelcache.stores.file.store import FORMAT_DIR


def opts(**kw: object) -> ProgramOptions:
    return ProgramOptions(arch=ARCH, **kw)


def call(cache, code=TRIVIAL, **kw) -> tuple[object, CompileInfo]:
    settle_timestamps()  # the headers a test just wrote are older than the compile's start
    info = CompileInfo()
    kw.setdefault("options", opts())
    obj = compile_program(code, cache=cache, info=info, **kw)
    return obj, info


def test_miss_then_hit_returns_the_same_cubin(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    first, i1 = call(cache)
    second, i2 = call(cache)
    assert (i1.hit, i2.hit) == (False, True)
    assert i1.key == i2.key and len(i1.key) == 32
    assert bytes(first.code) == bytes(second.code)
    assert second.code_type == "cubin" and bytes(second.code)[:4] == b"\x7fELF"
    assert i2.compile_seconds == pytest.approx(i1.compile_seconds)
    s = cache.stats()
    assert (s["hits"], s["misses"], s["compiles"], s["stores"]) == (1, 1, 1, 1)
    assert s["compile_seconds_saved"] > 0


@pytest.mark.parametrize(("target", "kind"), [("ptx", "ptx"), ("ltoir", "ltoir")])
def test_ptx_and_ltoir_without_a_driver(tmp_path, target: str, kind: str) -> None:
    cache = FileStreamProgramCache(tmp_path)
    options = opts(link_time_optimization=True) if target == "ltoir" else opts()
    a, i1 = call(cache, target_type=target, options=options)
    b, i2 = call(cache, target_type=target, options=options)
    assert (i1.hit, i2.hit) == (False, True)
    assert a.code_type == b.code_type == kind
    assert bytes(a.code) == bytes(b.code)
    if target == "ptx":
        assert b".entry fill" in bytes(b.code)


def test_ptx_source_to_cubin(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    ptx, _ = call(cache, target_type="ptx")
    a, i1 = call(cache, code=bytes(ptx.code).decode(), code_type="ptx", target_type="cubin")
    b, i2 = call(cache, code=bytes(ptx.code).decode(), code_type="ptx", target_type="cubin")
    assert (i1.hit, i2.hit) == (False, True) and bytes(a.code) == bytes(b.code)


def test_name_expressions_symbol_mapping_survives_a_hit(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    names = ("axpy<float>", "axpy<double>")
    a, i1 = call(cache, code=TEMPLATE, name_expressions=names)
    b, i2 = call(cache, code=TEMPLATE, name_expressions=names)
    assert (i1.hit, i2.hit) == (False, True)
    assert b.symbol_mapping == a.symbol_mapping
    assert b.symbol_mapping["axpy<float>"] == b"_Z4axpyIfEvT_PKS0_PS0_i"
    # A fresh process (a new run) sees the mapping too.
    code = (
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import compile_program, FileStreamProgramCache, CompileInfo\n"
        f"i = CompileInfo(); o = compile_program({TEMPLATE!r}, cache=FileStreamProgramCache({str(tmp_path)!r}),"
        f" options=ProgramOptions(arch={ARCH!r}), name_expressions={names!r}, info=i)\n"
        "print(i.hit, o.symbol_mapping['axpy<double>'])\n"
    )
    from helpers import run_python

    assert run_python(code).strip() == "True b'_Z4axpyIdEvT_PKS0_PS0_i'"


def test_logs_are_replayed_on_a_hit(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    miss_log, hit_log = io.StringIO(), io.StringIO()
    call(cache, code=WARNS, logs=miss_log)
    _, info = call(cache, code=WARNS, logs=hit_log)
    assert info.hit
    assert "kernelcache test remark" in miss_log.getvalue()
    assert hit_log.getvalue() == miss_log.getvalue()


@needs_bundled_headers
def test_heavy_kernel_with_bundled_headers(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    options = opts(use_bundled_headers=True, std="c++17")
    a, i1 = call(cache, code=HEAVY, options=options)
    b, i2 = call(cache, code=HEAVY, options=options)
    assert (i1.hit, i2.hit) == (False, True)
    assert bytes(a.code) == bytes(b.code)
    assert cache.stats()["compiles"] == 1  # an exact count, not a timing (a GC pause in a long run took 0.13 s)
    # The bundled headers are a user-writable copy: tracked, as any search directory's.
    assert any(os.sep + "nvrtc-bundled-headers" + os.sep in h for h in i2.headers)


def test_compile_errors_propagate_and_store_nothing(tmp_path) -> None:
    from cuda.core._utils.cuda_utils import NVRTCError

    cache = FileStreamProgramCache(tmp_path)
    with pytest.raises(NVRTCError, match="undefined"):
        call(cache, code='extern "C" __global__ void k() { undefined_thing(); }')
    assert cache.stats()["stores"] == 0 and len(cache) == 0


def test_disable_env_compiles_without_a_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    cache = FileStreamProgramCache(tmp_path)
    _, i1 = call(cache)
    _, i2 = call(cache)
    assert not i1.hit and not i2.hit and not i2.cached
    assert len(cache) == 0


def test_default_cache_is_kernelcache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "dflt"))
    _, i1 = call(None)
    _, i2 = call(None)
    assert (i1.hit, i2.hit) == (False, True)
    assert os.path.isdir(tmp_path / "dflt" / FORMAT_DIR / "entries")


def test_wrong_arguments_raise_at_once(tmp_path) -> None:
    cache = InMemoryProgramCache()
    with pytest.raises(ValueError, match="unknown target_type"):
        call(cache, target_type="elf")
    with pytest.raises(TypeError, match="ProgramCacheResource"):
        compile_program(TRIVIAL, options=opts(), cache={})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="extra_digest"):
        call(cache, extra_digest=b"")
    with pytest.raises(ValueError, match="side effect"):
        call(cache, options=opts(create_pch="x.pch"))


# -- header tracking ------------------------------------------------------------------


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A source with nested headers in include dirs and one found through the cwd."""
    root = tmp_path / "proj"
    (root / "inc" / "nested").mkdir(parents=True)
    (root / "inc" / "top.h").write_text('#pragma once\n#include "nested/deep.h"\n#define TOP 1\n')
    (root / "inc" / "nested" / "deep.h").write_text("#pragma once\n#define DEEP 2\n")
    (root / "local.h").write_text("#define LOCAL 3\n")
    monkeypatch.chdir(root)
    code = '#include "top.h"\n#include "local.h"\nextern "C" __global__ void k(int* x) { *x = TOP + DEEP + LOCAL; }\n'
    return root, code, opts(include_path=[str(root / "inc")])


def test_headers_are_tracked_without_extra_digest(tmp_path, project) -> None:
    root, code, options = project
    cache = FileStreamProgramCache(tmp_path / "cache")
    _, i1 = call(cache, code=code, options=options)
    assert sorted(os.path.relpath(h, root) for h in i1.headers) == [
        "inc/nested/deep.h",
        "inc/top.h",
        "local.h",
    ]
    _, i2 = call(cache, code=code, options=options)
    assert i2.hit  # nothing touched


@pytest.mark.parametrize("edited", ["inc/top.h", "inc/nested/deep.h", "local.h"])
def test_editing_any_header_is_a_miss_with_the_new_code(tmp_path, project, edited: str) -> None:
    root, code, options = project
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, _ = call(cache, code=code, options=options)
    path = root / edited
    path.write_text(path.read_text().replace(" 1\n", " 10\n").replace(" 2\n", " 20\n").replace(" 3\n", " 30\n"))
    after, info = call(cache, code=code, options=options)
    assert not info.hit
    assert bytes(after.code) != bytes(before.code)
    again, info2 = call(cache, code=code, options=options)
    assert info2.hit and bytes(again.code) == bytes(after.code)


def test_touching_without_change_is_still_a_hit(tmp_path, project) -> None:
    root, code, options = project
    cache = FileStreamProgramCache(tmp_path / "cache")
    call(cache, code=code, options=options)
    os.utime(root / "inc" / "top.h")
    (root / "local.h").write_text((root / "local.h").read_text())  # same bytes, new mtime
    _, info = call(cache, code=code, options=options)
    assert info.hit


def test_switching_back_to_old_header_content_is_a_hit(tmp_path, project) -> None:
    root, code, options = project
    cache = FileStreamProgramCache(tmp_path / "cache")
    original = (root / "local.h").read_text()
    call(cache, code=code, options=options)
    (root / "local.h").write_text("#define LOCAL 99\n")
    call(cache, code=code, options=options)
    (root / "local.h").write_text(original)
    _, info = call(cache, code=code, options=options)
    assert info.hit  # the manifest keeps several variants


def test_a_shadowing_header_earlier_on_the_path_is_a_miss(tmp_path, project) -> None:
    root, code, options = project
    cache = FileStreamProgramCache(tmp_path / "cache")
    call(cache, code=code, options=options)
    (root / "top.h").write_text('#pragma once\n#include "nested/deep.h"\n#define TOP 7\n')  # cwd: searched first
    (root / "nested").mkdir()
    (root / "nested" / "deep.h").write_text("#pragma once\n#define DEEP 8\n")
    shadowed, info = call(cache, code=code, options=options)
    assert not info.hit
    assert str(root / "top.h") in info.headers


def test_cwd_header_edit_seen_where_cuda_core_serves_stale(tmp_path, project) -> None:
    # No include_path at all: NVRTC still finds "local.h" in the current directory.
    root, _, _ = project
    code = '#include "local.h"\nextern "C" __global__ void k(int* x) { *x = LOCAL; }\n'
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, _ = call(cache, code=code)
    (root / "local.h").write_text("#define LOCAL 12345\n")
    after, info = call(cache, code=code)
    assert not info.hit and bytes(after.code) != bytes(before.code)


def test_pre_include_is_tracked(tmp_path, project) -> None:
    root, _, _ = project
    (root / "pre.h").write_text("#define PRE 5\n")
    code = 'extern "C" __global__ void k(int* x) { *x = PRE; }\n'
    options = opts(pre_include=str(root / "pre.h"))
    cache = FileStreamProgramCache(tmp_path / "cache")
    call(cache, code=code, options=options)
    assert call(cache, code=code, options=options)[1].hit
    (root / "pre.h").write_text("#define PRE 6\n")
    assert not call(cache, code=code, options=options)[1].hit


# -- single flight ------------------------------------------------------------------------


def test_threads_single_flight_one_compile(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    barrier = threading.Barrier(8)
    infos: list[CompileInfo] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=30)
            infos.append(call(cache, code=TEMPLATE, name_expressions=("axpy<float>",))[1])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    s = cache.stats()
    assert s["compiles"] == 1 and s["misses"] == 1 and s["hits"] == 7
    assert sum(1 for i in infos if i.waited) >= 1


@needs_bundled_headers
def test_processes_single_flight_one_compile(tmp_path) -> None:
    ctx = mp.get_context("spawn")
    root = str(tmp_path)
    with ctx.Pool(4) as pool:
        results = pool.starmap(w.compile_heavy, [(root, HEAVY, ARCH)] * 4)
    cache = FileStreamProgramCache(root)
    s = cache.stats()
    assert s["compiles"] == 1, s
    assert sorted(r[0] for r in results) == [False, True, True, True]
    assert len({r[1] for r in results}) == 1  # everyone got the same bytes


def test_different_keys_do_not_wait_for_each_other(tmp_path) -> None:
    from kernelcache.compile.flight import SingleFlight

    held = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with SingleFlight(b"key-a", 30).hold():
            held.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    with SingleFlight(b"key-b", 0.5).hold() as outcome:
        assert outcome == "acquired"
    with SingleFlight(b"key-a", 0.2).hold() as outcome:
        assert outcome == "timeout"  # bounded wait: the caller compiles on its own
    release.set()
    t.join(10)


def test_dead_lock_holder_releases_at_once(tmp_path) -> None:
    # A process that holds the file lock and is killed: waiters proceed immediately.
    import signal
    import subprocess
    import sys
    import time

    from kernelcache.compile.flight import SingleFlight

    lock = str(tmp_path / "k.lock")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import fcntl,os,time; fd=os.open({lock!r}, os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    with SingleFlight(b"k", 0.3, lock_path=lock).hold() as outcome:
        assert outcome == "timeout"
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    start = time.monotonic()
    with SingleFlight(b"k", 30, lock_path=lock).hold() as outcome:
        assert outcome == "acquired"
    assert time.monotonic() - start < 5


# -- failing caches never fail a compile ------------------------------------------------


def test_corrupt_entry_recompiles_with_one_warning(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    good, info = call(cache)
    entry = next(
        os.path.join(d, f)
        for d, _, fs in os.walk(tmp_path / FORMAT_DIR / "entries")
        for f in fs
        if not f.endswith(".meta") and os.path.getsize(os.path.join(d, f)) == len(bytes(good.code))
    )
    with open(entry, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    with pytest.warns(KernelCacheWarning, match="integrity"):
        again, info2 = call(cache)
    assert not info2.hit and bytes(again.code) == bytes(good.code)


def test_missing_sidecar_recompiles(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    good, _ = call(cache)
    for d, _, fs in os.walk(tmp_path / FORMAT_DIR / "entries"):
        for f in fs:
            if f.endswith(".meta"):
                os.unlink(os.path.join(d, f))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again, info = call(cache)
    assert not info.hit and bytes(again.code) == bytes(good.code)


def test_full_disk_still_returns_a_correct_object(tmp_path) -> None:
    with mounted_tmpfs("64k") as point:
        cache = FileStreamProgramCache(point)
        fd = os.open(os.path.join(point, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # the disk is now full
        finally:
            os.close(fd)
        with pytest.warns(KernelCacheWarning):
            obj, info = call(cache, code=TEMPLATE, name_expressions=("axpy<float>",))
        assert bytes(obj.code)[:4] == b"\x7fELF" and "axpy<float>" in obj.symbol_mapping


class _BrokenStore(InMemoryProgramCache):
    def _read(self, key):
        raise ConnectionError("store is down")

    def _write(self, key, payload, meta):
        raise OSError(28, "No space left on device")


def test_a_store_that_raises_degrades_to_compiling(tmp_path) -> None:
    cache = _BrokenStore()
    with pytest.warns(KernelCacheWarning, match="compiling without it"):
        obj, info = call(cache)
    assert not info.hit and bytes(obj.code)[:4] == b"\x7fELF"
    assert cache.stats()["errors"] >= 1
    assert set(cache.stats()["errors_by_cause"]) <= {"read", "write"}  # what a store raised, by the call


def test_failed_traced_compile_leaves_no_stray_trace_in_cwd(tmp_path, monkeypatch) -> None:
    # NVRTC 13.5 keeps trace state after a failed traced compile; the next untraced compile
    # then wrote ".json" into the current directory until compile_program reset it.
    from cuda.core._utils.cuda_utils import NVRTCError

    monkeypatch.chdir(tmp_path)
    cache = FileStreamProgramCache(tmp_path / "cache")
    with pytest.raises(NVRTCError):
        call(cache, code='extern "C" __global__ void k() { nope(); }')
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    call(cache)
    assert not (tmp_path / ".json").exists()
