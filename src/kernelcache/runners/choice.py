"""Where a compile runs: in the caller's process, or in a compiler worker (pool.py).

``runner_for`` decides, per compile, and both runners take the same arguments and return the
same ``(ObjectCode, log text, seconds)``: a result, a log, a warning or an error from a worker
is what the same compile in this process would have given (job.py runs the very NvrtcCall that
compilers.plan_compile makes here). Either way the compile holds one of the node's compile
slots while it runs (slots.py). What goes to a worker:
- every C++ compile with ``restrict=True``: NVRTC keeps ``--restrict`` on for the rest of the
  process that ran one, so it never runs in the caller; where no worker can start, it runs in a
  process forked for it alone (_in_a_fork), and the caller's later compiles stay a fresh
  process's (and are stored);
- with ``processes``: every C++ compile except C++ -> PTX where this process has a driver
  (cuda.core then checks the PTX against the driver, which a worker never loads).
Anything else (NVVM IR, PTX input, which may need the driver's linker) runs here.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import warnings
from typing import Any, Protocol

from kernelcache.log import WarnOnce
from kernelcache.runners import compilers, slots

__all__ = [
    "IN_PROCESS",
    "IN_WORKERS",
    "MIN_MISSES",
    "MISSES_PER_WORKER",
    "Runner",
    "batch_threads",
    "batch_uses_processes",
    "runner_for",
]

# compile_many(processes=None) compiles in workers from this many misses on, on a host with
# more than one usable core. Measured with benchmarks/bench_cold.py --only b on 2 cores (a
# fresh process, workers started inside the time; ratios to cuda.core's loop): K=8 threads
# 0.72, default 0.80; K=12 threads 0.58, default 0.67; K=16 0.61 vs 0.56; K=32 0.53 vs 0.50.
# Below it a worker's start (an interpreter and NVRTC's load, ~0.1 CPU-s) is not paid back.
MIN_MISSES = 16

# The default choice also starts at most one worker per this many misses. A worker's start is an
# interpreter plus NVRTC's first compile, in which NVRTC 13.0 loads the CUDA driver and initialises
# it (H200 host, benchmarks/bench_nvrtc_first.py: ~200 ms, nearly all system time; 15 ms once the
# process ran cuInit itself; then 16-19 ms per compile of the benchmark's), and starts slow each
# other down when many run at once (the first compile in a worker: ~260 ms with 5 starting
# together, ~440 ms with 15). So a worker must be given enough misses to pay
# its start back. Measured there (16 cores, K=64 misses in a fresh process, compile_many with max_workers 6 to 16):
# 5 workers 0.43-0.45 s, 7: 0.45-0.46, 9: 0.43-0.47, 11: 0.49-0.52, 15 (one per core): 0.52-0.55.
MISSES_PER_WORKER = 8


class Runner(Protocol):
    def run_compiler(self, request: Any, trace_path: str | None) -> tuple[Any, str, float]: ...


class _InProcess:
    """The compile runs in this process, on the calling thread, holding a slot of the node's."""

    def run_compiler(self, request: Any, trace_path: str | None) -> tuple[Any, str, float]:
        slot = slots.take()
        try:
            with _COMPILING:
                return compilers.run_compiler(request, trace_path)
        finally:
            if slot is not None:
                slot.release()


class _InWorkers:
    """The compile runs in a worker; the calling thread waits for it.

    A traced compile that fails leaves NVRTC's trace state set in the thread that ran it
    (compilers.reset_nvrtc_trace_state): the worker resets itself before it answers."""

    def run_compiler(self, request: Any, trace_path: str | None) -> tuple[Any, str, float]:
        ptx = request.code_type == "c++" and request.target_type == "ptx"
        _, _, call = compilers.plan_compile(request, trace_path, direct_ptx=ptx)
        if call is not None:
            kind, args = "nvrtc", (call, trace_path and os.path.dirname(trace_path))
        else:
            kind, args = "program", (request, trace_path)
        restrict = bool(getattr(request.options, "restrict", False))
        from kernelcache.runners import pool as pool_mod  # here: a hit never needs the pool

        try:
            outcome, value, shown = pool_mod.pool().run(kind, args, restrict, trace_path)
        except pool_mod.PoolUnavailable as exc:
            what = "this compile" if exc.this_call else "compiles"
            where = "a process forked for it" if restrict else "this process"
            _warned.warn(
                f"no-workers-{restrict}-{exc.this_call or 'start'}",
                f"compiler workers cannot take {what} ({exc}); compiling in {where}",
                stacklevel=3,
            )
            if not restrict:
                return IN_PROCESS.run_compiler(request, trace_path)
            outcome, value, shown = _in_a_fork(kind, args)
        _replay(shown)
        if outcome == "ok":
            data, mapping, log_text, seconds = value
            assert call is not None
            return call.object_code(data, mapping), log_text, seconds
        if outcome == "object":
            return value  # type: ignore[no-any-return]
        if outcome == "nvrtc-error":
            from cuda.core._utils.cuda_utils import NVRTCError

            raise NVRTCError(value)
        raise value


_warned = WarnOnce()
IN_PROCESS: Runner = _InProcess()
IN_WORKERS: Runner = _InWorkers()


def runner_for(request: Any, processes: bool = False) -> Runner:
    """The runner for one compile (see the module docstring for the rule)."""
    if request.code_type != "c++":
        return IN_PROCESS
    if getattr(request.options, "restrict", False):
        return IN_WORKERS
    if not processes or (request.target_type == "ptx" and compilers.driver_available()):
        return IN_PROCESS
    return IN_WORKERS


def batch_uses_processes(processes: bool | None, misses: int) -> bool:
    """compile_many's choice: ``processes`` when given, else workers from MIN_MISSES misses on
    a host with more than one usable core. TypeError for anything but True, False or None."""
    if processes is None:
        return misses >= MIN_MISSES and slots.usable_cores() > 1
    if type(processes) is not bool:
        raise TypeError(f"processes must be True, False or None (decide by the misses), not {processes!r}")
    return processes


def batch_threads(threads: int, misses: int, default_choice: bool) -> int:
    """The threads compile_many runs for ``misses`` (``threads``: max_workers or the CPU count).

    Never more than the misses; for the default choice of workers (the caller's thread
    compiling here, each other thread holding a worker), one worker per MISSES_PER_WORKER
    misses at most: max_workers given by the caller is theirs to choose and is used as given."""
    if default_choice:
        threads = min(threads, 1 + max(1, misses // MISSES_PER_WORKER))
    return max(1, min(threads, misses))


def _replay(shown: list[tuple[str, str, str]]) -> None:
    """The warnings the worker's compile raised, raised here (the caller's filters apply)."""
    import importlib

    for module, qualname, text in shown:
        category: Any = UserWarning
        try:
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
            if isinstance(found, type) and issubclass(found, Warning):
                category = found
        except Exception:
            pass
        warnings.warn(text, category, stacklevel=4)


class _Gate:
    """Compiles in this process hold it shared; a fork for a compile holds it alone, for the fork.

    Race: NVRTC serialises parts of a compile under a lock of its own. A fork while another
    thread holds it leaves it held forever in the child, whose compile then never ends. So the
    fork waits until no compile of ours runs here, and compiles wait for the fork (microseconds
    to milliseconds); a compile started by code other than kernelcache's is not seen."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._forking = False

    def __enter__(self) -> None:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._running += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def fork(self) -> int:
        with self._cond:
            while self._forking or self._running:
                self._cond.wait()
            self._forking = True
        try:
            with warnings.catch_warnings():  # 3.12+: "multi-threaded, fork() may deadlock": the gate is why not
                warnings.simplefilter("ignore", DeprecationWarning)
                return os.fork()
        finally:
            with self._cond:  # in the child too: a fresh gate there (_reset_in_child) makes this moot
                self._forking = False
                self._cond.notify_all()


_COMPILING = _Gate()


def _in_a_fork(kind: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``job.run_job``'s reply for one compile run in a child forked for it alone, which ends
    with it (NVRTC's --restrict ends with it). The child holds one of the node's slots; it
    reads nothing and writes nothing but its reply."""
    from kernelcache.keys.toolchain import library_file
    from kernelcache.runners.job import run_job
    from kernelcache.runners.pool import WorkerCrashed
    from kernelcache.runners.worker import environ_copy

    pickled = pickle.dumps(args, pickle.HIGHEST_PROTOCOL)
    library_file("nvrtc", load=True)  # loaded here, before the fork: the child loads nothing
    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None  # deleted: so it is for the child's compile (job.take_on)
    slot = slots.take()
    read_end, write_end = os.pipe()
    try:
        pid = _COMPILING.fork()
        if pid == 0:  # the child: one compile, its reply, and out (no atexit, no finalizers)
            try:
                os.close(read_end)
                reply = run_job(kind, pickled, cwd, environ_copy(), list(sys.path))
                with os.fdopen(write_end, "wb") as out:
                    out.write(pickle.dumps(reply, pickle.HIGHEST_PROTOCOL))
            finally:
                os._exit(0)
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, "rb") as f:
            read_end = -1
            data = f.read()
        _, status = os.waitpid(pid, 0)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        if slot is not None:
            slot.release()
    if not data:
        code = os.waitstatus_to_exitcode(status)
        raise WorkerCrashed(f"the process forked for this compile ended with status {code}")
    return pickle.loads(data)  # type: ignore[no-any-return]


def _reset_in_child() -> None:
    global _COMPILING
    _COMPILING = _Gate()  # another thread's compile runs in the parent, not here


from kernelcache import forksafe  # noqa: E402 - registered once the gate exists

forksafe.reset_function_in_child(_reset_in_child)
