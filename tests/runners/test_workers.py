"""Compiles in worker processes: the same results as in this process, real kills, real forks,
and NVRTC's --restrict leak kept out of the caller's process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from cuda.core import Program, ProgramOptions
from helpers import ARCH, in_forked_child, settle_timestamps, support_script
from sources import HEAVY, TEMPLATE, WARNS, needs_bundled_headers

from kernelcache import CompileManyError, FileStreamProgramCache, KernelCacheWarning, compile_many
from kernelcache.compile.flow import probe
from kernelcache.runners import compilers
from kernelcache.runners.choice import MIN_MISSES, MISSES_PER_WORKER, batch_threads
from kernelcache.runners.pool import WorkerCrashed, pool
from kernelcache.runners.worker import IDLE_S, boot_flags

CHILD = support_script("_pool_children.py")
BROKEN = 'extern "C" __global__ void broken(float* a) { a[threadIdx.x] = undefined_name; }\n'


def child(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    out = subprocess.run([sys.executable, CHILD, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def records(cache: FileStreamProgramCache) -> dict[str, tuple[bytes, dict[str, object]]]:
    """Every entry of the store: name -> (artifact, metadata without the timings)."""
    out = {}
    for entry in cache.iter_entries():
        with open(entry.path, "rb") as f:
            payload = _unordered_index(f.read())
        info = {k: v for k, v in (entry.meta or {}).items() if k != "created"}
        if (info.get("meta") or {}).get("kind") == "source-index":
            # Its checksums are of the bytes as written, in the order the threads stored: the
            # content is compared above, in a fixed order.
            info = {k: v for k, v in info.items() if k not in ("crc32", "sha256")}
        if isinstance(info.get("meta"), dict):
            info["meta"] = {k: v for k, v in info["meta"].items() if k != "compile_seconds"}
        out[entry.name] = (payload, info)
    return out


def _unordered_index(payload: bytes) -> bytes:
    """A source index with its entries sorted: the index lists them newest first, and which of
    one source's compiles stores first depends on the threads, in one process or across workers."""
    if not re.match(rb'\{"format":\d+,"entries":', payload):  # any format of the index (it was 1, is 2)
        return payload
    doc = json.loads(payload)
    doc["entries"].sort(key=lambda e: e["key"])
    return json.dumps(doc, sort_keys=True).encode()


def mixed_requests(inc: str) -> list[dict[str, object]]:
    o = ProgramOptions(arch=ARCH)
    return [
        {"code": TEMPLATE, "options": o, "name_expressions": ("axpy<float>", "axpy<double>")},
        {"code": WARNS, "options": o},  # a log
        {"code": TEMPLATE, "options": ProgramOptions(arch=ARCH, lineinfo=True), "name_expressions": ("axpy<int>",)},
        {"code": '#include "w.h"\nextern "C" __global__ void w(float* a) { a[0] = W; }\n', "options": o},
        {
            "code": '#include "v.h"\nextern "C" __global__ void v(float* a) { a[0] = V; }\n',
            "options": ProgramOptions(arch=ARCH, include_path=inc),
        },  # relative to the cwd
        {
            "code": TEMPLATE,
            "target_type": "ltoir",
            "options": ProgramOptions(arch=ARCH, link_time_optimization=True),
            "name_expressions": ("axpy<float>",),
        },
        {"code": TEMPLATE, "target_type": "ptx", "options": o, "name_expressions": ("axpy<float>",)},
    ]


@pytest.mark.parametrize("processes", [True, None], ids=["all-in-workers", "default"])
def test_results_records_and_headers_equal_an_in_process_compile(tmp_path, monkeypatch, processes) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.h").write_text("#define W 3.0f\n")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "v.h").write_text("#define V 4.0f\n")
    settle_timestamps()
    reqs = mixed_requests("inc")
    if processes is None:  # enough misses for the default to use workers (and the caller's thread)
        reqs += [
            {"code": TEMPLATE.replace("a * x[i]", f"{n}.0f * x[i]"), "options": ProgramOptions(arch=ARCH)}
            for n in range(MIN_MISSES - len(reqs))
        ]
    here, there = FileStreamProgramCache(tmp_path / "threads"), FileStreamProgramCache(tmp_path / "procs")
    # The spread batch first: it is this process's first sight of these sources, so its header
    # passes run (in workers where one is idle), as a batch's do; the batch after it reuses what
    # they found (compile.tracing), and its records must still be the same.
    crashes, compiled = pool().crashes, pool().compiles
    spread = compile_many(reqs, cache=there, processes=processes)
    in_workers = pool().compiles - compiled
    alone = compile_many(reqs, cache=here, processes=False)
    assert pool().crashes == crashes
    # True: every compile in a worker but C++ -> PTX where this process has a driver (cuda.core
    # checks that PTX against it: runners.choice); the default: the caller's thread compiles
    # here, the rest there. (How many reach a worker depends on its start, ~0.2 s against ~0.3 s
    # of these compiles: none may; tests/compile/test_batch_helpers.py counts the default's workers.)
    here_by_rule = sum(r.get("target_type") == "ptx" for r in reqs) if compilers.driver_available() else 0
    assert in_workers == len(reqs) - here_by_rule if processes else in_workers < len(reqs)
    # lineinfo goes through cuda.core's Program, which names the source by a temp file: its
    # bytes differ between any two compiles, in one process or not; all else must be equal.
    varying = probe(reqs[2]["code"], options=reqs[2]["options"], cache=there, name_expressions=("axpy<int>",))
    for i, (a, b) in enumerate(zip(alone, spread)):
        assert (a.code_type, a.symbol_mapping) == (b.code_type, b.symbol_mapping)
        if i != 2:
            assert (bytes(a.code), a.name) == (bytes(b.code), b.name)
        else:
            assert len(a.code) == len(b.code) and a.name.endswith(".cu") and b.name.endswith(".cu")
    # The same keys (the header-complete ones too), artifacts, logs, headers and manifests.
    mine, theirs = records(here), records(there)
    assert sorted(mine) == sorted(theirs) and len(mine) >= len(reqs) + 2  # + the manifests of w.h, v.h, ...
    for name in mine:
        if name != varying.entry_name:
            assert mine[name] == theirs[name]
        else:
            assert mine[name][1].keys() == theirs[name][1].keys()
    assert there.stats()["compiles"] == len(reqs)


def test_errors_come_back_as_in_process(tmp_path) -> None:
    reqs = [
        {"code": BROKEN, "options": ProgramOptions(arch=ARCH)},
        {"code": TEMPLATE, "options": ProgramOptions(arch=ARCH)},
    ]
    caught = []
    for processes, where in ((False, "threads"), (True, "procs")):
        with pytest.raises(CompileManyError) as err:
            compile_many(reqs, cache=FileStreamProgramCache(tmp_path / where), processes=processes)
        caught.append(err.value)
    a, b = (e.errors[0] for e in caught)
    assert (type(a), str(a), a.__cause__, a.__context__) == (type(b), str(b), None, None)
    assert "undefined_name" in str(b) and caught[1].results[1] is not None


def test_the_worker_compiles_in_the_callers_cwd_of_the_moment(tmp_path, monkeypatch) -> None:
    code = '#include "c.h"\nextern "C" __global__ void c(float* a) { a[0] = C; }\n'
    got = {}
    for name, value in (("one", "1.5f"), ("two", "2.5f")):
        d = tmp_path / name
        d.mkdir()
        (d / "c.h").write_text(f"#define C {value}\n")
    settle_timestamps()
    for name in ("one", "two", "one"):
        monkeypatch.chdir(tmp_path / name)
        reqs = [{"code": code, "options": ProgramOptions(arch=ARCH)}]
        procs = compile_many(reqs, cache=FileStreamProgramCache(tmp_path / f"p-{name}"), processes=True)
        here = compile_many(reqs, cache=FileStreamProgramCache(tmp_path / f"t-{name}"), processes=False)
        assert bytes(procs[0].code) == bytes(here[0].code)
        got.setdefault(name, bytes(procs[0].code))
    assert got["one"] != got["two"]


def test_restrict_never_leaks_into_what_is_stored(tmp_path) -> None:
    # A writer compiles with restrict=True, then without; a reader in another process and a
    # fresh process that compiled nothing else must see the same non-restrict code.
    for mode in ("one-by-one", "many"):
        root = str(tmp_path / mode)
        w = child("writer", root, mode)
        assert "ld.global.nc" in w["restricted"]  # restrict=True did apply, in its worker
        truth = child("fresh", "2")["ptx"]
        assert "ld.global.nc" not in truth
        assert w["clean"][0] == truth and w["after"] == truth
        r = child("reader", root)
        assert r["2"] == {"hit": True, "ptx": truth}
        if mode == "many":  # kernels 4 and 6 came from workers that also compiled restricted ones
            for n in ("4", "6"):
                assert r[n]["hit"] and r[n]["ptx"] == child("fresh", n)["ptx"]


def _stat(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read()


def _busy_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _kill_when_compiling(known: set[int], kills: int, killed: list[int]) -> None:
    """SIGKILL ``kills`` workers, each once it has burnt CPU on its compile (not at its start)."""
    deadline = time.monotonic() + 120
    while len(killed) < kills and time.monotonic() < deadline:
        for pid in pool().pids(compiling=True):
            if pid in known:
                continue
            try:
                start = _busy_ticks(pid)
                time.sleep(0.3)  # the CUB kernel compiles for seconds
                if pid not in pool().pids(compiling=True) or _busy_ticks(pid) - start < 5:
                    continue
                os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                continue
            known.add(pid)
            killed.append(pid)
        time.sleep(0.01)


@needs_bundled_headers
@pytest.mark.parametrize("kills", [1, 2])
def test_a_worker_killed_mid_compile_costs_one_retry_or_one_error(tmp_path, kills) -> None:
    pool().close()  # fresh workers only, so the watcher knows which ones are compiling the CUB kernel
    cache = FileStreamProgramCache(tmp_path / "c")
    heavy = {"code": HEAVY, "options": ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17")}
    small = {"code": TEMPLATE, "options": ProgramOptions(arch=ARCH)}
    killed: list[int] = []
    crashes = pool().crashes
    watcher = threading.Thread(target=_kill_when_compiling, args=(set(), kills, killed))
    watcher.start()
    try:
        if kills == 1:
            objs = compile_many([heavy], cache=cache, processes=True, max_workers=1)
        else:
            with pytest.raises(CompileManyError) as err:
                compile_many([heavy], cache=cache, processes=True, max_workers=1)
    finally:
        watcher.join()
    assert len(killed) == kills and pool().crashes - crashes == kills
    assert not set(killed) & set(pool().pids())
    if kills == 1:  # retried on a fresh worker: the right code (a plain cuda.core compile's), stored once
        plain = Program(HEAVY, "c++", options=heavy["options"])
        try:
            assert bytes(objs[0].code) == bytes(plain.compile("cubin").code)
        finally:
            plain.close()
        assert cache.stats()["compiles"] == 1 and records(cache)
    else:  # that request's error; nothing stored; the next batch works on fresh workers
        assert isinstance(err.value.errors[0], WorkerCrashed) and "signal 9" in str(err.value.errors[0])
        assert cache.stats()["compiles"] == 0 and not records(cache)
        assert compile_many([small], cache=cache, processes=True)[0] is not None


def test_a_forked_child_does_not_inherit_the_pool(tmp_path) -> None:
    reqs = [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH), "name_expressions": ("axpy<float>",)}]
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "parent"), processes=True)
    mine = pool().pids()
    assert mine

    def in_the_child() -> dict[str, list[int]]:  # still inside the lock: a pool of its own, empty until it compiles
        inherited = pool().pids()
        compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "child"), processes=True)
        return {"inherited": inherited, "own": pool().pids()}

    # Forked while the pool's lock is held (as by another thread handing out a worker): the
    # child must not need it.
    with pool()._cond:
        seen, code = in_forked_child(in_the_child)
    assert code == 0
    assert seen["inherited"] == [] and seen["own"] and not set(seen["own"]) & set(mine)
    # The parent's workers were left alone by the child and still serve the parent.
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "parent2"), processes=True)
    assert set(mine) <= set(pool().pids())


def test_workers_end_with_their_parent_even_a_killed_one(tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, CHILD, "pool_pids", str(tmp_path), "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        pids = json.loads(proc.stdout.readline())["pids"]  # type: ignore[union-attr]
        assert pids
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
            time.sleep(0.05)
        # Reaped by init once they exit (their parent is gone): gone, or at most zombies.
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and " Z " not in _stat(p)]
        assert not alive
    finally:
        proc.kill()


def test_workers_hold_no_cuda_context(tmp_path) -> None:
    # Where there is a driver, NVRTC's first compile loads libcuda and initialises it (measured on
    # the H200 host: /dev/nvidiactl and /dev/nvidia0 mapped, as in any process that compiled), so a
    # worker maps both; what it must never make is a context (GPU memory, a place in nvidia-smi),
    # which maps /dev/nvidia-uvm too (same host, driver 580: a context made after a compile adds it).
    reqs = [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH), "name_expressions": ("axpy<float>",)}]
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path), processes=True)
    assert pool().pids()
    for pid in pool().pids():
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
        assert "libnvrtc" in maps and "/dev/nvidia-uvm" not in maps


def _process_state(pid: int) -> str:
    """The state letter of /proc/PID/status ("Z": exited, not yet reaped; "gone": reaped)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line.split()[1] for line in f if line.startswith("State:"))
    except OSError:
        return "gone"


def test_pids_lists_no_worker_that_ended_after_its_idle_time(tmp_path) -> None:
    # A worker ends itself after idle_s without a compile ("bye"); the pool learns of it only
    # at its next use. pids() ("the workers alive now") listed it meanwhile: on the H200 host
    # test_workers_hold_no_cuda_context read such an exited worker's empty /proc/PID/maps.
    pool().close()
    pool().idle_s = 0.3
    try:
        reqs = [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH), "name_expressions": ("axpy<float>",)}]
        compile_many(reqs, cache=FileStreamProgramCache(tmp_path), processes=True)
        started = pool().pids()
        assert started
        deadline = time.monotonic() + 30
        while any(_process_state(pid) not in ("Z", "gone") for pid in started) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_process_state(pid) in ("Z", "gone") for pid in started)  # each ended on its own
        assert pool().pids() == []
    finally:
        pool().idle_s = IDLE_S
        pool().close()


def test_workers_that_cannot_start_leave_the_compile_in_this_process(tmp_path) -> None:
    got = child("no_interpreter", str(tmp_path))
    assert len(got["digests"]) == 3 and any("compiler workers cannot take compiles" in w for w in got["warnings"])
    assert FileStreamProgramCache(tmp_path).stats()["compiles"] == 3


def test_processes_must_be_a_bool_or_none(tmp_path) -> None:
    with pytest.raises(TypeError, match="processes must be True, False or None"):
        compile_many(
            [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH)}],
            cache=FileStreamProgramCache(tmp_path),
            processes=1,
        )  # type: ignore[arg-type]
    assert FileStreamProgramCache(tmp_path).stats()["compiles"] == 0


def test_a_deleted_cwd_is_deleted_for_the_worker_too(tmp_path, monkeypatch) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    reqs = [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH), "name_expressions": ("axpy<float>",)}]
    compiled = pool().compiles
    procs = compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "p"), processes=True)
    assert pool().compiles == compiled + 1  # in a worker, not in this process
    here = compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "t"), processes=False)
    assert bytes(procs[0].code) == bytes(here[0].code)


def test_arguments_a_worker_cannot_take_are_compiled_here(tmp_path, monkeypatch) -> None:
    import dataclasses

    # lineinfo: through cuda.core's Program, so the options themselves travel to the worker.
    @dataclasses.dataclass
    class LocalOptions(ProgramOptions):  # defined in a function: it cannot be pickled at all
        pass

    for name in ("late_options", "gone_options"):
        (tmp_path / f"{name}.py").write_text(
            "import dataclasses\nfrom cuda.core import ProgramOptions\n\n"
            "@dataclasses.dataclass\nclass LateOptions(ProgramOptions):\n    pass\n"
        )
    compile_many(
        [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH)}],
        cache=FileStreamProgramCache(tmp_path / "w"),
        processes=True,
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # after the workers started: each compile brings sys.path
    from gone_options import LateOptions as GoneOptions
    from late_options import LateOptions

    os.unlink(tmp_path / "gone_options.py")  # imported here, and nowhere to be found for a worker
    reqs = [{"code": TEMPLATE, "options": LateOptions(arch=ARCH, lineinfo=True), "name_expressions": ("axpy<float>",)}]
    compiled = pool().compiles
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "late"), processes=True)
    assert pool().compiles == compiled + 1  # found where this process finds it
    for n, options in enumerate((LocalOptions(arch=ARCH, lineinfo=True), GoneOptions(arch=ARCH, lineinfo=True))):
        reqs = [{"code": TEMPLATE, "options": options, "name_expressions": ("axpy<float>",)}]
        compiled = pool().compiles
        with pytest.warns(KernelCacheWarning, match="compiler workers cannot take this compile"):
            objs = compile_many(reqs, cache=FileStreamProgramCache(tmp_path / f"c{n}"), processes=True)
        assert pool().compiles == compiled and objs[0].symbol_mapping == {"axpy<float>": b"_Z4axpyIfEvT_PKS0_PS0_i"}
        assert FileStreamProgramCache(tmp_path / f"c{n}").stats()["compiles"] == 1


def test_a_worker_killed_while_it_starts_is_replaced_and_workers_stay_on(tmp_path) -> None:
    pool().close()
    killed: list[int] = []

    def kill_the_first_one() -> None:
        deadline = time.monotonic() + 60
        while not killed and time.monotonic() < deadline:
            for pid in pool().pids():  # at once: during its imports, before it is ready
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
            time.sleep(0.0005)

    watcher = threading.Thread(target=kill_the_first_one)
    watcher.start()
    crashes = pool().crashes
    try:
        objs = compile_many(
            [{"code": TEMPLATE, "options": ProgramOptions(arch=ARCH), "name_expressions": ("axpy<float>",)}],
            cache=FileStreamProgramCache(tmp_path),
            processes=True,
        )
    finally:
        watcher.join()
    assert killed and pool().crashes == crashes + 1 and not pool().unavailable
    assert objs[0].symbol_mapping == {"axpy<float>": b"_Z4axpyIfEvT_PKS0_PS0_i"} and killed[0] not in pool().pids()


def test_warm_uses_the_workers_from_enough_misses(tmp_path) -> None:
    from kernelcache.cli import warm

    manifest = tmp_path / "m.json"
    kernels = [
        {"name": f"k{i}", "code": TEMPLATE.replace("a * x[i]", f"{i}.5f * x[i]"), "name_expressions": ["axpy<float>"]}
        for i in range(MIN_MISSES)
    ]
    kernels.append({"name": "broken", "code": BROKEN})
    manifest.write_text(json.dumps({"defaults": {"arch": ARCH}, "kernel": kernels}))
    compiled = pool().compiles
    results = warm.run(warm.load_manifest(str(manifest)), str(tmp_path / "c"), 2, progress=False)
    assert 0 < pool().compiles - compiled < MIN_MISSES + 1  # the calling thread compiled some here
    assert [r.get("error", "")[:12] for r in results] == [""] * MIN_MISSES + ["NVRTCError: "]
    assert FileStreamProgramCache(tmp_path / "c").stats()["compiles"] == MIN_MISSES


@pytest.mark.gpu
def test_with_a_context_here_workers_load_no_driver_and_get_kernels_uses_them(tmp_path) -> None:
    from cuda.core import Device

    from kernelcache import KernelCache

    dev = Device(0)
    dev.set_current()  # this process holds a CUDA context; its workers are spawned, not forked
    arch = f"sm_{dev.arch}"
    code = 'extern "C" __global__ void g{n}(float* a) {{ a[threadIdx.x] *= {n}.0f; }}\n'
    reqs = [
        {"code": code.format(n=n), "name": f"g{n}", "options": ProgramOptions(arch=arch)} for n in range(MIN_MISSES)
    ]
    compiled = pool().compiles
    kernels = KernelCache(FileStreamProgramCache(tmp_path)).get_kernels(reqs, device=0)
    assert all(k is not None for k in kernels) and pool().compiles > compiled
    # NVRTC itself opens the driver's device files when it compiles (a fresh process that only
    # calls nvrtcCompileProgram through cuda.bindings holds /dev/nvidiactl, /dev/nvidia0 and
    # /dev/nvidia-uvm afterwards: seen on the H200 host), so a worker may hold what plain NVRTC
    # holds and nothing more: no context of this process's reached it (spawned, not forked).
    nvrtc_alone = subprocess.run([sys.executable, "-c", _NVRTC_ALONE], capture_output=True, text=True, check=True)
    allowed = set(json.loads(nvrtc_alone.stdout))
    for pid in pool().pids():
        assert set(_driver_files(pid)) <= allowed, (_driver_files(pid), allowed)
    assert _driver_files(os.getpid())  # the check sees a context where there is one


_NVRTC_ALONE = """
import json, os
from cuda.bindings import nvrtc
err, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void g(float* a) { a[0] = 1; }', b"p", 0, [], [])
nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
held = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        held.add(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        pass
print(json.dumps(sorted(p for p in held if p.startswith("/dev/nvidia"))))
"""


def _driver_files(pid: int) -> list[str]:
    """The /dev/nvidia* files process ``pid`` holds open (an fd closed meanwhile is skipped)."""
    held = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return [path for path in held if path.startswith("/dev/nvidia")]


def test_the_default_gives_each_worker_enough_misses_and_max_workers_is_used_as_given() -> None:
    # 16 cores, 64 misses: the caller's thread + one worker per MISSES_PER_WORKER misses.
    assert batch_threads(16, 64, default_choice=True) == 1 + 64 // MISSES_PER_WORKER
    assert batch_threads(16, 4, default_choice=True) == 2  # one worker at least, as many threads as misses at most
    assert batch_threads(16, 64, default_choice=False) == 16  # processes=True/False, or max_workers given
    assert batch_threads(16, 3, default_choice=False) == 3


def test_workers_skip_site_when_the_path_alone_finds_their_packages(tmp_path) -> None:
    """Here kernelcache and cuda come from sys.path entries: the workers run ``python -S``; a
    kernelcache imported from where sys.path does not lead keeps ``site`` in the worker."""
    compile_many(
        [{"code": BROKEN.replace("undefined_name", "1.0f"), "options": ProgramOptions(arch=ARCH)}],
        processes=True,
        cache=FileStreamProgramCache(tmp_path / "c"),
    )
    assert boot_flags() == ("-S",)
    for pid in pool().pids():
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert f.read().split(b"\0")[1] == b"-S"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    src = os.path.dirname(os.path.dirname(os.path.abspath(__import__("kernelcache").__file__)))
    os.symlink(os.path.join(src, "kernelcache"), elsewhere / "kc")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('kernelcache', {str(elsewhere / 'kc' / '__init__.py')!r},"
        f" submodule_search_locations=[{str(elsewhere / 'kc')!r}])\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['kernelcache'] = mod; spec.loader.exec_module(mod)\n"
        "from kernelcache.runners.worker import boot_flags; print(boot_flags())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ""},
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "()"


def test_a_worker_that_finds_another_kernelcache_is_never_used(tmp_path) -> None:
    # The checkout this process imported kernelcache from is moved away (a deploy, a branch
    # switch): a worker started now finds another copy on sys.path (an editable install's) or
    # none. Either way it must not compile for us: this process compiles, with one warning.
    import shutil

    import kernelcache

    copy, further = tmp_path / "src", tmp_path / "further"
    for where in (copy, further):
        shutil.copytree(os.path.dirname(kernelcache.__file__), where / "kernelcache")
    code = (
        "import json, os, sys, warnings\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import FileStreamProgramCache, compile_many\n"
        "from kernelcache.runners.pool import pool\n"
        "src = 'extern \"C\" __global__ void m(float* a) { a[0] = %d; }'\n"
        f"many = lambda n: compile_many([{{'code': src % n, 'options': ProgramOptions(arch='{ARCH}')}}],\n"
        "                               cache=FileStreamProgramCache(sys.argv[2]), processes=True)\n"
        "many(1)  # a worker of ours: everything the pool needs is imported here\n"
        "before = pool().compiles\n"
        "pool().close()\n"
        "os.rename(sys.argv[1] + '/kernelcache', sys.argv[1] + '/away')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    objs = many(2)\n"
        "print(json.dumps({'compiled': objs[0] is not None, 'in_workers': pool().compiles - before,\n"
        "                  'first': before, 'warnings': [str(w.message) for w in caught]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(copy), str(tmp_path / "c")],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": f"{copy}:{further}"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["first"] == 1 and seen["compiled"] and seen["in_workers"] == 0, seen
    assert [w for w in seen["warnings"] if "compiler workers cannot take compiles" in w]


def test_a_worker_that_ended_idle_costs_the_next_compile_nothing(tmp_path) -> None:
    """An idle worker ends by itself after pool().idle_s (its slot free for others); the next
    compile, sent to it after it ended, goes to a fresh worker: no crash, no retry counted."""
    pool().close()
    pool().idle_s = 0.2
    try:
        reqs = [{"code": BROKEN.replace("undefined_name", f"{n}.0f"), "options": ProgramOptions(arch=ARCH)} for n in (1, 2)]
        compile_many(reqs[:1], cache=FileStreamProgramCache(tmp_path / "a"), processes=True)
        (first,) = pool().pids()
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{first}") and " Z " not in _stat(first) and time.monotonic() < deadline:
            time.sleep(0.02)
        crashes, compiled = pool().crashes, pool().compiles
        compile_many(reqs[1:], cache=FileStreamProgramCache(tmp_path / "b"), processes=True)
        assert (pool().crashes, pool().compiles) == (crashes, compiled + 1)
        assert first not in pool().pids()
    finally:
        pool().idle_s = IDLE_S
        pool().close()
