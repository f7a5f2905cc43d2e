"""The header pass beside the compile: NVRTC's front end (compilers.header_pass) run in another
process while this process's thread runs the plain compile, so a miss costs about a plain
compile's wall time where a core is free (the pass alone is 0.5-0.9x of the compile, run after
it: the miss was 1.5-2.2x a plain compile, bench_real_kernels.py's cold phase).

Why another process and not a thread: NVRTC serialises part of every compile inside one process
(pool.py), so a pass on a thread slows the compile beside it (two CUB compiles on two threads:
5.3 s against 3.5 s one after the other). And the rule kept since NVRTC 13.5 was measured making
it: after a traced compile that fails, NVRTC may drop header events from every later trace in the
process (compilers.header_pass); the pass runs before the compile is known to succeed, so a
failed pass ends with the process it ran in. (A failed front-end-only pass, a syntax error or a
missing header, was not seen to do that with 13.5 here; the rule stays until no NVRTC does.)

Which process: an idle compiler worker of this process's pool (pool.spare), where one is; a
worker whose pass failed is dropped (pool.run_on). Else a child forked for the one pass, which
inherits the loaded NVRTC and leaves by ``os._exit`` (on the H200 host a forked child's
compiles run about 1.4x slower than this process's: so a spare worker is started for the next
miss, pool.add_spare). Wherever neither can run (one usable core, no slot free or another
process waiting for one, another compile of ours running in this process), the pass runs
after the compile as before (``start`` returns None); a pass lost on the way (a worker that
ended, a child that died or outlived its bound) is replaced by that pass too (``finish``).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from _queue import SimpleQueue  # queue.SimpleQueue itself; `queue` imports heapq and more (0.7 ms)
from collections.abc import Callable
from typing import Any

from kernelcache import forksafe
from kernelcache.runners import compilers, slots

# A pass reads what the compile read and generates no code: it takes less time than the compile
# did (measured on the corpus: 0.5-0.9x). A child still running well past that is stuck (a fork
# while a compile that is not ours held NVRTC's lock, see choice._Gate): it is killed and the
# pass runs here instead. The floor keeps a loaded machine from retiring a healthy child
# often; one retired early costs the pass here, never a wrong result.
_BOUND_FACTOR, _BOUND_FLOOR_S = 3.0, 2.0


class Forked:
    """A forked child running one header pass; its slot is held until the child is reaped."""

    def __init__(self, pid: int, slot: slots.Slot | None, args: tuple[str, bytes, tuple[bytes, ...], str]) -> None:
        self.pid, self.slot, self.args = pid, slot, args
        self.started = time.monotonic()

    def finish(self, compile_seconds: float) -> None:
        """Wait for the child. Where it died or ran past its bound (killed then), run the pass
        here; where the pass itself failed (a header changed since the compile read it), the
        child removed its trace and the variant refuses to be stored, as after the pass here."""
        outcome = self._outcome(self.started + max(_BOUND_FLOOR_S, _BOUND_FACTOR * compile_seconds))
        _spare_for_the_next()
        if outcome == "lost":
            compilers.remove_trace(self.args[3])  # a killed child's trace may be half written
            compilers.header_pass(*self.args)

    def cancel(self) -> None:
        """The compile failed: its pass is of no use (the flow removes the trace)."""
        if self.pid:
            self._kill()
            _spare_for_the_next()

    def _outcome(self, deadline: float) -> str:
        """ "ok", "failed" (the pass failed: the child exited 1) or "lost" (it died, or was
        killed at ``deadline``)."""
        pause = 0.0005
        try:
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.pid = 0
                    code = os.waitstatus_to_exitcode(status)
                    return "ok" if code == 0 else "failed" if code == 1 else "lost"
                if time.monotonic() >= deadline:
                    self._kill()
                    return "lost"
                time.sleep(pause)  # a child has no fd to wait on; polls are cheap next to a compile
                pause = min(pause * 2, 0.01)
        finally:
            self._release()

    def _kill(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = 0
        self._release()

    def _release(self) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None


def _spare_for_the_next() -> None:
    """A worker started for the next miss's pass, on the slot the child just gave back (a forked
    child's compiles run slower than a fresh process's: see the module's docstring)."""
    from kernelcache.runners.pool import pool

    pool().add_spare()


class InWorker:
    """One header pass sent to an idle compiler worker, on a thread of its own that waits for the reply."""

    def __init__(
        self, workers: Any, worker: Any, args: tuple[str, bytes, tuple[bytes, ...], str], traced: Any = None
    ) -> None:
        self.args, self.reply, self.traced = args, None, traced
        job = compilers.header_pass_job(args)
        self.thread = threading.Thread(target=self._send, args=(workers, worker, job), daemon=True)
        self.thread.start()

    def _send(self, workers: Any, worker: Any, job: tuple[Any, ...]) -> None:
        try:
            self.reply = workers.run_on(worker, "nvrtc", job)
        except BaseException:  # noqa: BLE001 - a pass lost is run here instead (finish)
            self.reply = None
        if self.reply is not None and self.reply[0] == "ok" and self.traced is not None:
            self.traced()  # never raises (tracing.HeaderTrace.prepare)

    def finish(self, compile_seconds: float) -> None:
        """Wait for the worker's reply. Where the worker ended first, run the pass here; where
        the pass failed (a header changed since the compile read it), remove its trace: the
        variant then refuses to be stored, as after a failed pass here."""
        self.thread.join()
        if self.reply is None:
            compilers.remove_trace(self.args[3])
            compilers.header_pass(*self.args)
        elif self.reply[0] != "ok":
            compilers.remove_trace(self.args[3])

    def cancel(self) -> None:
        """The compile failed: wait for the pass (a worker is never left owing a reply)."""
        self.thread.join()


def start(request: Any, trace_path: str | None, gate: Any, traced: Any = None) -> InWorker | Forked | None:
    """The header pass of ``request`` into ``trace_path``, started now beside the compile: in an
    idle worker (``traced`` is then called on its thread once the trace is written), or in a
    child forked through ``gate`` (choice._COMPILING); None where the pass must run after the
    compile instead."""
    if trace_path is None or request.code_type != "c++" or slots.usable_cores() < 2:
        return None
    source, options, _ = compilers.plan_compile(request, None)
    args = compilers.header_pass_args(source, options, request.target_type, trace_path)
    from kernelcache.runners.pool import pool

    workers = pool()
    worker = workers.spare()
    if worker is not None:
        return InWorker(workers, worker, args, traced)
    return _fork(args, gate)


def _fork(args: tuple[str, bytes, tuple[bytes, ...], str], gate: Any) -> Forked | None:
    """A child forked now through ``gate``, running the pass; None where none may be."""
    slot = None
    if slots.enabled():
        if slots.others_wait():  # the node's cores are spoken for: one compile, one core
            return None
        slot = slots.try_take()
        if slot is None:
            return None
    from kernelcache.keys.toolchain import library_file

    library_file("nvrtc", load=True)  # loaded before the fork: the child loads nothing
    from cuda.bindings import nvrtc  # noqa: F401 - imported before the fork, for the same reason

    prctl, parent = _prctl(), os.getpid()
    try:
        pid = gate.try_fork()
    except OSError:
        pid = None
    if pid is None:
        if slot is not None:
            slot.release()
        return None
    if pid == 0:  # the child: the pass, and out (no atexit, no finalizers, no flush of the parent's buffers)
        code = 1
        try:
            # Never outlives the caller: killed by the kernel when the forking thread ends (it
            # waits for this child while it lives, so only with the process). Race: the parent
            # died before the prctl: then it is gone already, seen by the parent pid.
            if prctl is not None:
                prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() == parent:
                code = 0 if compilers.header_pass(*args) else 1
        finally:
            os._exit(code)
    return Forked(pid, slot, args)


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Any:
    """libc's prctl (found before a fork: the child only calls it), or None off Linux."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


class Job:
    """``fn(*args)`` given to a kept thread (on_a_thread); ``result()`` waits for it to end and
    re-raises what it raised (any number of times)."""

    __slots__ = ("_fn", "_args", "_error", "_done")

    def __init__(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self._fn, self._args, self._error = fn, args, None
        self._done = threading.Lock()  # held until the job ends: a lock is the cheapest wait there is
        self._done.acquire()

    def run(self) -> None:
        try:
            self._fn(*self._args)
        except BaseException as exc:  # noqa: BLE001 - handed to result(), as a Future would
            self._error = exc
        finally:
            self._fn = self._args = None  # type: ignore[assignment]
            self._done.release()

    def result(self) -> None:
        with self._done:
            pass
        if self._error is not None:
            raise self._error


# The kept threads. Not concurrent.futures' ThreadPoolExecutor: importing it imports logging,
# 3-12 ms here on the first miss of every process, for a pool that never needs more than
# this. Invariant, under _lock: _idle == threads waiting in _jobs.get() - jobs queued, so a job
# is queued only when a thread will take it (one waiting now, or a busy one once it is done).
_jobs: SimpleQueue[Job] | None = None
_idle = _started = 0
_lock = threading.Lock()


def on_a_thread(fn: Callable[..., None], *args: Any) -> Job:
    """``fn(*args)`` on a thread kept for work beside a compile (compile.tracing's build of a
    known variant, compile.strict's bookkeeping of a miss). Kept, not started per compile:
    Thread.start() waits for the new thread, which then holds the GIL for its first Python work
    before the caller gets it back (0.6 ms of a CuPy miss, measured here); a kept thread takes
    the job once the compile releases the GIL. At most one thread per core; past that a job
    waits for the first free one. RuntimeError at interpreter shutdown (no thread can start then)."""
    global _jobs, _idle, _started
    job = Job(fn, args)
    with _lock:
        if _jobs is None:
            _jobs = SimpleQueue()
        if _idle <= 0 and _started < (os.cpu_count() or 1):
            thread = threading.Thread(target=_serve, args=(job, _jobs), name="kernelcache-beside", daemon=True)
            thread.start()  # RuntimeError at shutdown: nothing was counted yet
            _started += 1
        else:
            _idle -= 1
            _jobs.put(job)
    return job


def _serve(job: Job, jobs: SimpleQueue[Job]) -> None:
    global _idle
    while True:
        job.run()
        with _lock:
            _idle += 1
        job = jobs.get()


def _forget_threads_in_child() -> None:
    global _jobs, _idle, _started, _lock
    _jobs, _idle, _started, _lock = None, 0, 0, threading.Lock()  # the parent's threads are not the child's


forksafe.reset_function_in_child(_forget_threads_in_child)
