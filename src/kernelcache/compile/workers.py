"""Compiler worker processes: compiles that run outside the caller's process.

Why processes: NVRTC serialises part of every compile inside one process, so compiles on threads
stop scaling long before the cores do (benchmarks/bench_nvrtc_scaling.py); compiles in separate
processes do not. And NVRTC keeps ``--restrict`` on for the rest of a process once one compile
used it: a ``restrict=True`` compile therefore always runs in a worker, never in the caller's
process, and a worker that ran one compiles only ``restrict=True`` requests from then on.

The pool: one per process, created on first use; workers are started on demand (spawned with
``subprocess``, i.e. fork + exec: a caller holding a CUDA context is never forked into a Python
child), or handed over warm by the node's compile server (server.py, where one runs: a worker
there has paid its start already), and reused until the process exits. A worker imports NVRTC's bindings, never the CUDA
driver, and creates no context (worker_main.py); NVRTC 13.0 itself initialises the driver in a
process's first compile (benchmarks/bench_nvrtc_first.py): most of a worker's start on a GPU host.
Each compile carries the caller's working directory and environment as they are at that moment.
Only the compile moves: look-ups, single flight, header tracking and storing stay in the caller,
exactly as for an in-process compile, so a worker never writes to a store.

Failures: a worker that dies during a compile (killed, out of memory) costs that compile one retry
on a fresh worker; a second death is that compile's error (WorkerCrashed). Nothing of a dead
worker's reply is used: a reply is read whole or not at all. Workers that cannot start here (no
usable interpreter, a broken environment) make the pool unavailable: compiles then run in the
caller's process, with one warning. A forked child does not inherit the pool: it closes its copies
of the pipes and starts its own workers if it needs any.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
from typing import Any

from kernelcache import config
from kernelcache.compile import compilers
from kernelcache.compile.worker_proc import Died, Worker, boot_flags

__all__ = ["PoolUnavailable", "WorkerCrashed", "WorkerPool", "boot_flags", "pool", "usable_cores"]


class WorkerCrashed(RuntimeError):
    """A compiler worker died during this compile, and so did the fresh one it was retried on."""


class WorkerPool:
    """The process's compiler workers; ``run`` hands one compile to an idle worker."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # workers at most (compile_many raises it to its thread count)
        self.crashes = 0  # workers that died during a compile (or before they were ready)
        self.ready = False  # a worker of this pool was ready once: workers can run here
        self.compiles = 0  # compiles that workers answered
        self.adopted = 0  # workers the compile server handed over (server.py), already warm
        self.unavailable = ""  # why workers cannot start here ("" while they can)
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()
        self._starting = 0

    def pids(self, compiling: bool = False) -> list[int]:
        """The process ids of the workers alive now (``compiling``: of those running a compile)."""
        with self._cond:
            return sorted(w.pid for w in self._all if w.compiling or not compiling)

    def run(self, kind: str, args: tuple[Any, ...], restrict: bool, trace_path: str | None) -> tuple[Any, ...]:
        """One compile in a worker: ``(outcome, value, warnings)``.

        WorkerCrashed when the worker dies during it twice; PoolUnavailable when workers
        cannot start here, or cannot be given these arguments (the caller then compiles in
        its own process).
        """
        try:
            pickled = pickle.dumps(args, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # e.g. options of a class defined in a function
            raise PoolUnavailable(f"its arguments cannot be sent to a worker ({exc})", this_call="send") from None
        for attempt in (1, 2):
            worker = self._checkout(restrict)
            # Tainted before the compile is sent: whatever interrupts us from here on, a
            # worker that may have run it is never handed a clean compile.
            was_restrict, worker.restrict = worker.restrict, worker.restrict or restrict
            try:
                reply = worker.exchange(kind, pickled)
            except Died as died:
                self._drop(worker)
                if died.foreign:  # our checkout moved or went: compile in the caller from now on
                    self._give_up(str(died))
                    raise PoolUnavailable(str(died)) from None
                with self._cond:
                    self.crashes += 1
                    self.ready = self.ready or died.started
                if attempt == 2 and not self.ready:
                    # Two workers in a row died before they were ready, and none ever was:
                    # workers cannot run here (a broken environment); compile in the caller.
                    self._give_up(str(died))
                    raise PoolUnavailable(str(died)) from None
                if attempt == 2:
                    raise WorkerCrashed(f"{died} during this compile, after a retry on a fresh worker") from None
                if trace_path is not None:
                    compilers.remove_trace(trace_path)  # NVRTC merges into a trace already there
                continue
            except BaseException:
                # Interrupted (Ctrl-C) with a reply still owed: that worker is never reused.
                self._drop(worker)
                raise
            if reply[0] == "unreadable":
                worker.restrict = was_restrict  # it compiled nothing
            try:
                with self._cond:
                    self.ready = True
                    self.compiles += reply[0] != "unreadable"
            finally:
                self._checkin(worker)  # it owes no reply: reusable even if we are interrupted here
            if reply[0] == "unreadable":
                raise PoolUnavailable(f"a worker cannot read its arguments ({reply[1]})", this_call="read")
            return reply
        raise AssertionError("unreachable")

    def _checkout(self, restrict: bool) -> Worker:
        retire = None
        with self._cond:
            while True:
                if self.unavailable:
                    raise PoolUnavailable(self.unavailable)
                # A worker in the right state: restrict=True compiles prefer one that already
                # ran one (it can do nothing else), and may taint a clean one.
                fits = [w for w in self._idle if w.restrict == restrict] or (self._idle[:] if restrict else [])
                if fits:
                    self._idle.remove(fits[0])
                    return fits[0]
                tainted = [w for w in self._idle if w.restrict]
                if len(self._all) + self._starting < self.limit or tainted:
                    if len(self._all) + self._starting >= self.limit:
                        retire = tainted[0]  # make room: a clean compile cannot use it
                        self._idle.remove(retire)
                        self._all.discard(retire)
                    self._starting += 1
                    break
                self._cond.wait()
        worker = None
        try:
            if retire is not None:
                retire.close()
            try:
                worker = self._new_worker()
            except config.ConfigError:
                raise  # a bad setting (the compile server's) is the caller's to fix, not a fallback
            except Exception as exc:  # no interpreter there, no fds left, ...
                self._give_up(f"cannot start a compiler worker ({sys.executable}): {exc}")
                raise PoolUnavailable(self.unavailable) from None
        finally:
            # Also when interrupted (Ctrl-C during the start): the place taken above is given
            # back, or the pool would wait for a worker that never comes once all are lost.
            with self._cond:
                self._starting -= 1
                if worker is not None:
                    self._all.add(worker)
                else:
                    self._cond.notify()
        return worker

    def _new_worker(self) -> Worker:
        """A warm worker from this node's compile server when it has one for us, else one started here."""
        from kernelcache.compile import server_link

        worker = server_link.adopt_worker()
        if worker is None:
            return Worker.start()
        with self._cond:
            self.adopted += 1
        return worker

    def _checkin(self, worker: Worker) -> None:
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def _drop(self, worker: Worker) -> None:
        with self._cond:
            self._all.discard(worker)
            self._cond.notify()
        worker.close(kill=True)

    def _give_up(self, why: str) -> None:
        with self._cond:
            self.unavailable = self.unavailable or why
            self._cond.notify_all()

    def close(self) -> None:
        """End every worker (idle ones at once; the pool can start new ones afterwards)."""
        with self._cond:
            workers, self._idle, self._all = list(self._all), [], set()
        for worker in workers:
            worker.close()

    def forget(self) -> None:
        """In a forked child: let go of the parent's workers, no lock taken (_forget_in_child closes their pipes)."""
        _FORGOTTEN.append(self)  # their Popen objects are the parent's to reap: never collected here


class PoolUnavailable(Exception):
    """Compiler workers cannot take this compile (the reason is the text); ``this_call``: only
    this one (its arguments), not any (they cannot start in this process)."""

    def __init__(self, why: str, this_call: str = "") -> None:
        super().__init__(why)
        self.this_call = this_call  # "send" or "read": what failed for this compile; "": no workers


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()
_FORGOTTEN: list[Any] = []


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pool() -> WorkerPool:
    """This process's worker pool (created, not started, on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool(max(2, usable_cores()))
        return _POOL


def _forget_in_child() -> None:
    # After worker_proc's own hook (registered first, on import), which closed the workers' pipes.
    global _POOL, _POOL_LOCK
    _POOL_LOCK = threading.Lock()  # another thread may have held it at the fork
    if _POOL is not None:
        _POOL.forget()
        _POOL = None


def _close_at_exit() -> None:
    if _POOL is not None:
        _POOL.close()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_close_at_exit)
