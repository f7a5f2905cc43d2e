"""The kernel lockfile (KERNELCACHE_RECORD) and ``kernelcache warm --arch``: real compiles, real processes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import warnings
from typing import Any

import pytest
from cuda.core import ProgramOptions
from helpers import mounted_tmpfs, remount_read_only, run_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from option_sets import SOURCES, compile_kinds, option_fields

from kernelcache import CompileInfo, FileStreamProgramCache, KernelCacheWarning, compile_many, compile_program
from kernelcache.cli.warm import load_manifest
from kernelcache.config import ConfigError

# The original program: one kernel for the arch given on its command line, options that
# must survive JSON (a (name, value) macro pair, a list of macros, a name expression).
PROGRAM = textwrap.dedent(
    """
    import json, sys
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, compile_program
    src = 'template <typename T> __global__ void axpy(T a, T* x) { x[threadIdx.x] *= a + N + M; }\\n'
    opts = ProgramOptions(arch=sys.argv[1], define_macro=[("N", "2"), "M=1"], std="c++17")
    info = CompileInfo()
    compile_program(src, options=opts, name_expressions=("axpy<float>",), info=info)
    print(json.dumps({"hit": info.hit, "key": info.entry_name}))
    """
)


def _kc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _lines(path: str) -> list[dict]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().splitlines()]


def test_a_recorded_run_replayed_for_two_archs_makes_a_fresh_process_hit_for_both(tmp_path) -> None:
    lock = str(tmp_path / "kernels.lock.json")
    first, fresh = str(tmp_path / "first"), str(tmp_path / "fresh")
    out = json.loads(run_python(PROGRAM, "sm_80", env={"KERNELCACHE_DIR": first, "KERNELCACHE_RECORD": lock}))
    assert not out["hit"]
    assert len(_lines(lock)) == 1
    warm = _kc("warm", lock, "--arch", "sm_80", "--arch", "sm_90", "--cache-dir", fresh, "-j", "2", "--json")
    assert warm.returncode == 0, warm.stderr
    assert sorted((r["arch"], r["hit"]) for r in json.loads(warm.stdout)) == [("sm_80", False), ("sm_90", False)]
    for arch in ("sm_80", "sm_90"):
        again = json.loads(run_python(PROGRAM, arch, env={"KERNELCACHE_DIR": fresh}))
        assert again["hit"], arch
    assert FileStreamProgramCache(fresh).stats()["compiles"] == 2  # warm's two; the program's none


def test_warm_fills_a_strict_programs_cache_with_require_hit_set(tmp_path) -> None:
    # Every kernel failed with CacheMissError, whose text says to run `kernelcache warm`.
    lock, fresh = str(tmp_path / "kernels.lock.json"), str(tmp_path / "fresh")
    run_python(PROGRAM, "sm_90", env={"KERNELCACHE_DIR": str(tmp_path / "first"), "KERNELCACHE_RECORD": lock})
    warm = _kc("warm", lock, "--cache-dir", fresh, env={"KERNELCACHE_REQUIRE_HIT": "1"})
    assert warm.returncode == 0, warm.stdout + warm.stderr
    strict = {"KERNELCACHE_DIR": fresh, "KERNELCACHE_REQUIRE_HIT": "1"}
    assert json.loads(run_python(PROGRAM, "sm_90", env=strict))["hit"]


def test_hits_are_recorded_too_once_per_process(tmp_path, monkeypatch) -> None:
    lock = str(tmp_path / "lock.json")
    cache = FileStreamProgramCache(str(tmp_path / "c"))
    src = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
    compile_program(src, options=ProgramOptions(arch="sm_90"), cache=cache)  # not recording yet
    monkeypatch.setenv("KERNELCACHE_RECORD", lock)
    for _ in range(3):
        info = CompileInfo()
        compile_program(src, options=ProgramOptions(arch="sm_90"), cache=cache, info=info)
        assert info.hit
    (line,) = _lines(lock)
    assert line["kernel"][0]["code"] == src and line["kernel"][0]["arch"] == "sm_90"


def test_compile_many_requests_are_recorded(tmp_path, monkeypatch) -> None:
    lock = str(tmp_path / "lock.json")
    monkeypatch.setenv("KERNELCACHE_RECORD", lock)
    srcs = [f'extern "C" __global__ void k{i}(float* a) {{ a[0] = {i}.0f; }}\n' for i in range(2)]
    compile_many([{"code": s, "options": ProgramOptions(arch="sm_90")} for s in srcs], cache=None, max_workers=1)
    assert sorted(item.name for item in load_manifest(lock)) == ["k0", "k1"]


RECORDER = textwrap.dedent(
    """
    import sys, time
    from cuda.core import ProgramOptions
    from kernelcache.compile import lockfile
    from kernelcache.compile.request import CompileRequest
    who, count, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    opts = ProgramOptions(arch="sm_90")
    pad = "// " + "x" * 200_000 + "\\n"  # lines far beyond one pipe buffer (4 KiB): no atomic write()
    while time.time() < start_at:
        time.sleep(0.001)
    for i in range(count):
        src = pad + f'extern "C" __global__ void k_{who}_{i}(float* a) {{ a[0] = {i}.0f; }}\\n'
        lockfile.record(CompileRequest.of(src, options=opts))
    """
)


def test_processes_recording_into_one_file_lose_and_tear_no_line(tmp_path) -> None:
    import time

    lock = str(tmp_path / "lock.json")
    procs, count = 4, 25
    start_at = f"{time.time() + 2.0:.3f}"  # one instant for all: their appends overlap
    children = [
        subprocess.Popen(
            [sys.executable, "-c", RECORDER, str(p), str(count), start_at],
            env={**os.environ, "KERNELCACHE_RECORD": lock},
            stderr=subprocess.PIPE,
        )
        for p in range(procs)
    ]
    for child in children:
        assert child.wait(timeout=300) == 0, child.stderr.read() if child.stderr else ""
    lines = _lines(lock)  # every line is whole JSON
    names = sorted(line["kernel"][0]["name"] for line in lines)
    assert names == sorted(f"k_{p}_{i}" for p in range(procs) for i in range(count))


def test_a_line_torn_by_a_dead_writer_costs_that_line_only(tmp_path, monkeypatch, capfd) -> None:
    lock = tmp_path / "lock.json"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(lock))
    src = 'extern "C" __global__ void first(float* a) { a[0] = 1.0f; }\n'
    compile_program(src, options=ProgramOptions(arch="sm_90"), cache=None)
    with open(lock, "ab") as f:  # what a writer killed mid-line leaves: a line without its end
        f.write(b'{"kernel":[{"name":"torn","co')
    compile_program(src.replace("first", "after"), options=ProgramOptions(arch="sm_90"), cache=None)
    assert [item.name for item in load_manifest(str(lock))] == ["first", "after"]
    assert "skipped line(s) [2]" in capfd.readouterr().err


def test_a_line_broken_by_a_hand_edit_is_an_error_naming_it_not_a_kernel_dropped(tmp_path, monkeypatch) -> None:
    lock = tmp_path / "lock.json"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(lock))
    for name in ("first", "second", "third"):
        src = f'extern "C" __global__ void {name}(float* a) {{ a[0] = 1.0f; }}\n'
        compile_program(src, options=ProgramOptions(arch="sm_90"), cache=None)
    lines = lock.read_text().splitlines()
    lines[1] = lines[1].replace('"arch":', '"arch"', 1)  # a colon lost in an editor, mid-file
    lock.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"line 2: Expecting ':' delimiter"):
        load_manifest(str(lock))
    proc = _kc("warm", str(lock), "--cache-dir", str(tmp_path / "c"))
    assert proc.returncode != 0 and "line 2" in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "c" / "v2")  # nothing warmed from a manifest it could not read


def test_a_request_a_manifest_cannot_replay_is_not_recorded_with_one_warning(tmp_path, monkeypatch) -> None:
    lock = tmp_path / "lock.json"
    monkeypatch.setenv("KERNELCACHE_RECORD", str(lock))
    src = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for n in range(2):
            compile_program(src, options=ProgramOptions(arch="sm_90"), extra_digest=b"v%d" % n, cache=None)
    assert not lock.exists()
    assert len([w for w in seen if "extra_digest" in str(w.message)]) == 1


def test_record_variable_errors_name_the_variable(tmp_path, monkeypatch) -> None:
    src = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
    for bad in (str(tmp_path), str(tmp_path / "missing" / "lock.json")):
        monkeypatch.setenv("KERNELCACHE_RECORD", bad)
        with pytest.raises(ConfigError, match="KERNELCACHE_RECORD"):
            compile_program(src, options=ProgramOptions(arch="sm_90"), cache=None)


def test_an_unwritable_lockfile_never_fails_a_compile(monkeypatch) -> None:
    with mounted_tmpfs("64k") as point:
        remount_read_only(point)  # EROFS for anyone, root included
        monkeypatch.setenv("KERNELCACHE_RECORD", os.path.join(point, "lock.json"))
        src = 'extern "C" __global__ void k(float* a) { a[0] = 2.0f; }\n'
        with pytest.warns(KernelCacheWarning, match="cannot record"):
            obj = compile_program(src, options=ProgramOptions(arch="sm_90"), cache=None)
        assert obj.code


def test_a_fifo_at_the_lockfile_path_never_blocks_a_compile(tmp_path) -> None:
    # A line larger than a pipe's buffer, written to a FIFO no one reads, blocked forever.
    fifo = tmp_path / "lock.json"
    os.mkfifo(fifo)
    code = textwrap.dedent(
        """
        import warnings
        from cuda.core import ProgramOptions
        from kernelcache import CompileInfo, compile_program
        src = "// " + "x" * 300_000 + "\\n" + 'extern "C" __global__ void k(float* a) { a[0] = 3.0f; }\\n'
        info = CompileInfo()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile_program(src, options=ProgramOptions(arch="sm_90"), info=info)
        print(info.hit, [str(w.message) for w in caught if "record" in str(w.message)])
        """
    )
    env = {"KERNELCACHE_RECORD": str(fifo), "KERNELCACHE_DIR": str(tmp_path / "cache")}
    hit, warned = run_python(code, env=env, timeout=60).split(" ", 1)
    assert hit == "False" and "not a regular file" in warned and warned.count("cannot record") == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_relative_lockfile_in_a_deleted_working_directory_never_fails_a_compile(tmp_path) -> None:
    # abspath() of the relative path raised FileNotFoundError: the compile failed, and the
    # default cache (its configuration check) was reported unusable.
    code = textwrap.dedent(
        """
        import os, sys, warnings
        from cuda.core import ProgramOptions
        from kernelcache import CompileInfo, compile_program
        os.chdir(sys.argv[1]); os.rmdir(sys.argv[1])
        info = CompileInfo()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile_program('extern "C" __global__ void k(float* a) { a[0] = 4.0f; }',
                            options=ProgramOptions(arch="sm_90"), info=info)
        print(info.cached, [str(w.message) for w in caught])
        """
    )
    (tmp_path / "gone").mkdir()
    env = {"KERNELCACHE_RECORD": "lock.json", "KERNELCACHE_DIR": str(tmp_path / "cache")}
    cached, warned = run_python(code, str(tmp_path / "gone"), env=env, timeout=120).split(" ", 1)
    assert cached == "True" and "cannot record compile requests in lock.json" in warned
    assert "cannot be used" not in warned


def test_warm_lists_a_recorded_triton_kernel_and_compiles_none(tmp_path, monkeypatch) -> None:
    pytest.importorskip("triton")
    from kernelcache.triton import KernelCacheManager

    lock = str(tmp_path / "lock.json")
    monkeypatch.setenv("KERNELCACHE_RECORD", lock)
    key = "a" * 52
    assert KernelCacheManager(key).get_group("add_kernel.json") is None  # Triton's look-up: a miss
    (line,) = _lines(lock)
    assert line == {"kernel": [{"name": "add_kernel", "code_type": "triton", "triton_key": key}]}
    out = _kc("warm", lock, "--arch", "sm_90", "--cache-dir", str(tmp_path / "c"), env={"KERNELCACHE_RECORD": ""})
    assert out.returncode == 0, out.stderr
    assert "add_kernel" in out.stdout and "skipped" in out.stdout


def test_warm_arch_that_nvrtc_does_not_know_is_one_line(tmp_path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"kernel": [{"name": "k", "code": "__global__ void k() {}"}]}))
    out = _kc("warm", str(manifest), "--arch", "sm_7", "--cache-dir", str(tmp_path / "c"))
    assert out.returncode == 2 and "--arch sm_7" in out.stderr and "Traceback" not in out.stderr


def test_warm_arch_bundle_serves_a_fresh_process_with_an_empty_cache_for_both_archs(tmp_path) -> None:
    lock, built = str(tmp_path / "kernels.lock.json"), str(tmp_path / "built")
    run_python(PROGRAM, "sm_80", env={"KERNELCACHE_DIR": str(tmp_path / "run"), "KERNELCACHE_RECORD": lock})
    out = tmp_path / "image" / "kernels.kcb"
    out.parent.mkdir()
    warm = _kc("warm", lock, "--arch", "sm_80", "--arch", "sm_90", "--bundle", str(out), "--cache-dir", built, "--json")
    assert warm.returncode == 0, warm.stderr
    data = json.loads(warm.stdout)
    assert len(data["kernels"]) == 2 and data["bundle"]["path"] == str(out)
    # Two artifacts, and the source index that explains a miss: every record of the cache.
    assert data["bundle"]["records"] == 3
    env = {"KERNELCACHE_DIR": str(tmp_path / "empty"), "KERNELCACHE_BUNDLES": str(out), "KERNELCACHE_REQUIRE_HIT": "1"}
    for arch in ("sm_80", "sm_90"):
        assert json.loads(run_python(PROGRAM, arch, env=env))["hit"], arch


def test_warm_writes_no_bundle_when_a_kernel_fails(tmp_path) -> None:
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"kernel": [{"name": "bad", "code": "__global__ void k() { nope; }"}]}))
    out = tmp_path / "k.kcb"
    warm = _kc("warm", str(manifest), "--bundle", str(out), "--cache-dir", str(tmp_path / "c"))
    assert warm.returncode == 1 and "no bundle written" in warm.stdout
    assert not out.exists()


# -- the record is the request: one codec, both directions ----------------------------------


def _replayed_key(request: Any, lock: str) -> tuple[list, list]:
    """The request's key components, and those of what warm makes of its lockfile line."""
    from kernelcache.cli.warm import program_options
    from kernelcache.compile import lockfile
    from kernelcache.compile.request import CompileRequest
    from kernelcache.keys.derive import key_components

    def components(r: CompileRequest) -> list:
        return key_components(
            code=r.code,
            code_type=r.code_type,
            options=r.options,
            target_type=r.target_type,
            name_expressions=r.name_expressions,
            headers_tracked=r.code_type == "c++",
        )

    lockfile.record(request)
    (item,) = load_manifest(lock)
    replayed = CompileRequest.of(item.code, item.code_type, item.target_type, program_options(item), item.name_expressions)
    return components(request), components(replayed)


@given(kind=compile_kinds(), fields=option_fields(), names=st.lists(st.sampled_from(["f<int>", "g"]), max_size=2))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_recorded_request_replays_to_the_identical_key(kind, fields, names) -> None:
    from kernelcache.compile.request import CompileRequest

    code_type, target_type = kind
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = ProgramOptions(**fields)
    request = CompileRequest.of(SOURCES[code_type], code_type, target_type, options, tuple(names))
    try:
        from kernelcache.keys.derive import key_components

        key_components(
            code=request.code, code_type=code_type, options=options, target_type=target_type,
            name_expressions=request.name_expressions, headers_tracked=code_type == "c++",
        )
    except Exception:
        return  # a request no key can be made for is not one warm replays
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        lock = os.path.join(tmp, "lock.json")
        mp.setenv("KERNELCACHE_RECORD", lock)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            original, replayed = _replayed_key(request, lock)
    assert replayed == original, fields


@pytest.mark.parametrize(
    "argv",
    [
        ("-arch=sm_90", "-DN=4", "-UN", "--std=c++17"),
        ("-I", "inc", "-ftz=true", "-arch=sm_90", "--device-as-default-execution-space"),
        ("--gpu-architecture=compute_90", "-use_fast_math", "-diag-suppress=177,550"),
    ],
)
def test_a_cupy_command_line_replays_verbatim(argv: tuple[str, ...], tmp_path, monkeypatch) -> None:
    from kernelcache.compile.nvrtc_argv import argv_options
    from kernelcache.compile.request import CompileRequest

    lock = str(tmp_path / "lock.json")
    monkeypatch.setenv("KERNELCACHE_RECORD", lock)
    request = CompileRequest.of(SOURCES["c++"], "c++", "cubin", argv_options(argv))
    original, replayed = _replayed_key(request, lock)
    assert replayed == original
    assert _lines(lock)[0]["kernel"][0]["nvrtc_argv"] == list(argv)


def test_a_cupy_hit_through_its_index_is_recorded_as_its_compile_is(tmp_path, monkeypatch) -> None:
    # kernelcache.cupy's index hit makes no CompileRequest (no cuda.core import there): its
    # line must be the very line compile_program writes for that request (warm reads one).
    from kernelcache.compile import lockfile
    from kernelcache.compile.nvrtc_argv import argv_options

    argv = ("-I", "inc", "-DN=4", "-arch=sm_90", "--device-as-default-execution-space")
    lock = str(tmp_path / "lock.json")
    monkeypatch.setenv("KERNELCACHE_RECORD", lock)
    monkeypatch.chdir(tmp_path)
    src = 'extern "C" __global__ void k(float* a) { a[0] = N; }\n'
    compile_program(src, options=argv_options(argv), name_expressions=("k",), cache=None)
    lockfile.record_argv(src, "cubin", argv, ("k",))
    with open(lock, "rb") as f:
        first, second = f.read().splitlines()
    assert first == second
    assert json.loads(first)["kernel"][0]["cwd"] == str(tmp_path)


def test_warm_arch_replaces_the_arch_flag_of_a_cupy_command_line(tmp_path, monkeypatch) -> None:
    from kernelcache.cli.warm import for_archs, request_of
    from kernelcache.compile.nvrtc_argv import argv_options

    lock = str(tmp_path / "lock.json")
    monkeypatch.setenv("KERNELCACHE_RECORD", lock)
    src = 'extern "C" __global__ void k(float* a) { a[0] = 1.0f; }\n'
    compile_program(src, options=argv_options(("-DN=1", "--gpu-architecture=sm_90", "-ftz=true")), cache=None)
    (item,) = for_archs(load_manifest(lock), ["sm_80"])
    replayed = request_of(item).options
    assert replayed.nvrtc_argv == ("-DN=1", "--gpu-architecture=sm_80", "-ftz=true") and replayed.arch == "sm_80"
