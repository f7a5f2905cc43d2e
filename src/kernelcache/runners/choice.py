"""Where a compile runs: in the caller's process, or in a compiler worker (pool.py).

Both runners return the same ``(ObjectCode, log text, seconds)``: what a worker gives is what the
same compile here would (job.py runs the very NvrtcCall that compilers.plan_compile makes here),
and either holds one of the node's compile slots while it runs (slots.py). To a worker go every
C++ compile with ``restrict=True`` (NVRTC keeps ``--restrict`` on for the rest of a process that
ran one: never the caller; where no worker can start, a process forked for it alone), and with
``processes`` every C++ compile but C++ -> PTX where this process has a driver (cuda.core checks
that PTX against the driver, which a worker never loads). NVVM IR and PTX input run here. A
remote runner (remote.OnExecutor, ``warm --executor``) takes the C++ compiles it says it takes.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from kernelcache.log import WarnOnce
from kernelcache.runners import beside, compilers, slots

__all__ = ["IN_PROCESS", "IN_WORKERS", "MIN_MISSES", "MISSES_PER_WORKER", "batch_threads", "batch_uses_processes"]
__all__ += ["result_of_reply", "run_header_pass", "runner_for"]

# compile_many(processes=None) compiles in workers from MIN_MISSES misses on, on a host with more
# than one usable core, with one worker per MISSES_PER_WORKER misses at most: a worker's start (an
# interpreter, NVRTC's load, and on a GPU host the CUDA driver's initialisation in NVRTC's first
# compile: ~0.2 s, benchmarks/bench_nvrtc_first.py) must be paid back. The figures behind both
# (bench_cold.py --only b, here and on the H200 host) are in README's "Compile workers".
MIN_MISSES = 16
MISSES_PER_WORKER = 8


class Runner(Protocol):
    """``traced``: called on another thread once the trace is written while the compile still
    runs (a header pass beside it: beside.py), for work on the trace to overlap the compile.
    ``started``: called on the calling thread right before the compiler takes over (NVRTC's
    compile in this process, the job handed to a worker or an executor), once or more: work
    beside the compile begins then, when this thread is about to release the GIL for long, not
    earlier, where it would take the GIL at each of this thread's system calls before it."""

    def run_compiler(
        self,
        request: Any,
        trace_path: str | None,
        traced: Callable[[], None] | None = None,
        *,
        started: Callable[[], None] | None = None,
    ) -> tuple[Any, str, float]: ...


class _InProcess:
    """The compile runs in this process, on the calling thread, holding a slot of the node's;
    its header pass, where a second slot is free, beside it in another process (beside.py)."""

    def run_compiler(
        self,
        request: Any,
        trace_path: str | None,
        traced: Callable[[], None] | None = None,
        *,
        started: Callable[[], None] | None = None,
    ) -> tuple[Any, str, float]:
        slot = slots.take()
        pass_beside = None
        try:
            # Forked outside the gate (it counts this thread's compile too); None: the pass runs
            # after the compile, here. Waited for inside it: a pass that must then run here is
            # an NVRTC call no fork of another thread may catch halfway.
            pass_beside = beside.start(request, trace_path, _COMPILING, traced)
            with _COMPILING:
                result = compilers.run_compiler(request, None if pass_beside else trace_path, started)
                if pass_beside is not None:
                    pass_beside.finish(result[2])
            return result
        finally:
            if pass_beside is not None:
                pass_beside.cancel()  # the compile failed (or was interrupted): the child goes; else a no-op
            if slot is not None:
                slot.release()


class _InWorkers:
    """The compile runs in a worker; the calling thread waits for it.

    A traced compile that fails leaves NVRTC's trace state set in the thread that ran it
    (compilers.reset_nvrtc_trace_state): the worker resets itself before it answers."""

    def run_compiler(
        self,
        request: Any,
        trace_path: str | None,
        traced: Callable[[], None] | None = None,
        *,
        started: Callable[[], None] | None = None,
    ) -> tuple[Any, str, float]:
        ptx = request.code_type == "c++" and request.target_type == "ptx"
        _, _, call = compilers.plan_compile(request, trace_path, direct_ptx=ptx)
        if call is not None:
            kind, args = "nvrtc", (call, trace_path and os.path.dirname(trace_path))
        else:
            kind, args = "program", (request, trace_path)
        restrict = bool(getattr(request.options, "restrict", False))
        from kernelcache.runners import pool as pool_mod  # here: a hit never needs the pool

        if started is not None:
            started()  # this thread only waits from here on
        try:
            outcome, value, shown = pool_mod.pool().run(kind, args, restrict, trace_path)
        except pool_mod.NoSlot:
            return IN_PROCESS.run_compiler(request, trace_path)  # never restrict=True (pool.NoSlot)
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
        return result_of_reply(call, outcome, value, shown)


def run_header_pass(runner: Runner, request: Any, trace_path: str) -> None:
    """The header pass of ``request`` alone, after its compile ran without one (compile.tracing:
    the headers an earlier pass of the same preprocessing listed no longer hold), where
    ``runner`` (IN_PROCESS or IN_WORKERS) ran the compile. A pass that fails or is lost leaves
    no trace: the variant then refuses to be stored."""
    source, options, _ = compilers.plan_compile(request, None)
    args = compilers.header_pass_args(source, options, request.target_type, trace_path)
    if runner is IN_WORKERS:
        job = compilers.header_pass_job(args)
        restrict = bool(getattr(request.options, "restrict", False))
        from kernelcache.runners import pool as pool_mod

        try:
            outcome = pool_mod.pool().run("nvrtc", job, restrict, trace_path)[0]
        except (pool_mod.NoSlot, pool_mod.PoolUnavailable):
            outcome = _in_a_fork("nvrtc", job)[0] if restrict else None
        except Exception:  # noqa: BLE001 - a worker that died twice: the result is not stored
            outcome = "lost"
        if outcome is not None:
            if outcome != "ok":
                compilers.remove_trace(trace_path)
            return
    slot = slots.take()
    try:
        with _COMPILING:
            compilers.header_pass(*args)
    finally:
        if slot is not None:
            slot.release()


def result_of_reply(call: Any, outcome: str, value: Any, shown: list[tuple[str, str, str]]) -> tuple[Any, str, float]:
    """What the compile gives here, from job.run_job's reply for it (``call``: the NvrtcCall it ran,
    None for kind "program"): its warnings raised here, its result, or its error raised here."""
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
    if outcome == "unreadable":
        raise RuntimeError(f"the process that compiles cannot read its arguments ({value})")
    raise value


_warned = WarnOnce()
IN_PROCESS: Runner = _InProcess()
IN_WORKERS: Runner = _InWorkers()


def runner_for(request: Any, processes: bool = False, remote: Any = None) -> Runner:
    """The runner for one compile (see the module docstring for the rule); ``remote``: a runner
    (remote.OnExecutor) that takes the compiles it says it takes."""
    if remote is not None and remote.takes(request):
        return remote  # type: ignore[no-any-return]
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

    Race: NVRTC serialises parts of a compile under a lock of its own; a fork while another thread
    holds it leaves it held forever in the child. So the fork waits until no compile of ours runs
    here (a compile of code other than kernelcache's is not seen), and compiles wait for the fork."""

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
        return self._fork()

    def try_fork(self) -> int | None:
        """fork() now, or None where a compile of ours runs (or another fork is made) here."""
        with self._cond:
            if self._forking or self._running:
                return None
            self._forking = True
        return self._fork()

    def _fork(self) -> int:
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
