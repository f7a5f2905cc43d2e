"""This process's compiler workers: NVRTC serialises part of every compile inside one process, so
compiles on threads stop scaling long before the cores do (benchmarks/bench_nvrtc_scaling.py);
and it keeps ``--restrict`` on for the rest of a process that used it (a worker that ran one takes
only ``restrict=True`` compiles from then on).

A worker is started when a compile finds none idle and a compile slot of the node's is free; it
holds that slot for its life. Where none is free, a compile waits for a worker of ours, or runs in
the caller (NoSlot). Workers end idle, and after a compile while another process waits for a slot.
A worker that dies during a compile costs it one retry on a fresh worker; a second death is its
error (WorkerCrashed). Workers that cannot start here (no interpreter, a broken environment,
another NVRTC or kernelcache than ours) make the pool unavailable. A forked child starts its own.
"""

from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
import time
from typing import Any

from kernelcache.runners import compilers, slots
from kernelcache.runners.worker import IDLE_S, Died, Retired, Worker

__all__ = ["NoSlot", "PoolUnavailable", "WorkerCrashed", "WorkerPool", "pool"]

_POLL_S = 0.005  # how often a compile waiting for a worker of ours also tries for a slot


class WorkerCrashed(RuntimeError):
    """A compiler worker died during this compile, and so did the fresh one it was retried on."""


class NoSlot(Exception):
    """Every compile slot of the node is held and no worker of ours will come back: the compile
    runs in the caller (waiting for a slot there), not in a worker started for it."""


class PoolUnavailable(Exception):
    """Compiler workers cannot take this compile (the reason is the text); ``this_call``: only
    this one (its arguments), not any (they cannot start in this process)."""

    def __init__(self, why: str, this_call: str = "") -> None:
        super().__init__(why)
        self.this_call = this_call  # "send" or "read": what failed for this compile; "": no workers


class WorkerPool:
    """The process's compiler workers; ``run`` hands one compile to an idle worker."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # workers at most (compile_many raises it to its thread count)
        self.crashes = 0  # workers that died during a compile (or before they were ready)
        self.ready = False  # a worker of this pool was ready once: workers can run here
        self.compiles = 0  # compiles that workers answered
        self.started = 0  # workers started
        self.idle_s = IDLE_S  # a worker started from now on ends after this long without a compile
        self.unavailable = ""  # why workers cannot start here ("" while they can)
        self._cond = threading.Condition()
        self._idle: list[Worker] = []
        self._all: set[Worker] = set()
        self._starting = 0

    def pids(self, compiling: bool = False) -> list[int]:
        """The process ids of the workers alive now (``compiling``: of those running a compile).

        A worker that ended itself (idle for idle_s: "bye") stays in the pool until its next
        use finds it gone; it is not alive, so it is left out here (poll reaps it)."""
        with self._cond:
            return sorted(w.pid for w in self._all if (w.compiling or not compiling) and w.proc.poll() is None)

    def run(self, kind: str, args: tuple[Any, ...], restrict: bool, trace_path: str | None) -> tuple[Any, ...]:
        """One compile in a worker: ``(outcome, value, warnings)`` (job.run_job's).

        WorkerCrashed when the worker dies during it twice; PoolUnavailable when workers
        cannot start here, or cannot be given these arguments (then it runs elsewhere)."""
        try:
            pickled = pickle.dumps(args, pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # e.g. options of a class defined in a function
            raise PoolUnavailable(f"its arguments cannot be sent to a worker ({exc})", this_call="send") from None
        deaths = 0
        while True:
            worker = self._checkout(restrict)
            # Tainted before the compile is sent: whatever interrupts us from here on, a
            # worker that may have run it is never handed a clean compile.
            was_restrict, worker.restrict = worker.restrict, worker.restrict or restrict
            try:
                reply = worker.exchange(kind, pickled)
            except Retired:
                self._drop(worker)  # it ran nothing: another worker takes it
                continue
            except Died as died:
                deaths += 1
                self._died(worker, died, deaths)
                if trace_path is not None:
                    compilers.remove_trace(trace_path)  # NVRTC merges into a trace already there
                continue
            except BaseException:
                self._drop(worker)  # interrupted (Ctrl-C) with a reply still owed: never reused
                raise
            if reply[0] == "unreadable":
                worker.restrict = was_restrict  # it compiled nothing
            with self._cond:
                self.ready = True
                self.compiles += reply[0] != "unreadable"
            self._checkin(worker)  # it owes no reply: reusable even if we are interrupted here
            if reply[0] == "unreadable":
                raise PoolUnavailable(f"a worker cannot read its arguments ({reply[1]})", this_call="read")
            return reply

    def spare(self) -> Worker | None:
        """An idle worker for clean compiles, taken now; None where none is idle (none is started)."""
        with self._cond:
            for worker in self._idle:
                if not worker.restrict:
                    self._idle.remove(worker)
                    return worker
        return None

    def run_on(self, worker: Worker, kind: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """One job on ``worker`` (taken by ``spare``): its reply, or None where the worker ended
        first (dropped). A job that did not succeed drops the worker too: the header pass is
        its one user (beside.py), and a failed traced compile may change NVRTC for the rest of a
        process (compilers.header_pass)."""
        try:
            reply = worker.exchange(kind, pickle.dumps(args, pickle.HIGHEST_PROTOCOL))
        except (Retired, Died):
            self._drop(worker)
            return None
        except BaseException:
            self._drop(worker)  # interrupted with a reply still owed: never reused
            raise
        with self._cond:
            self.ready = True
            self.compiles += reply[0] != "unreadable"
        if reply[0] == "ok":
            self._checkin(worker)
        else:
            self._drop(worker)
        return reply

    def add_spare(self) -> None:
        """Start one worker and leave it idle for a compile to come, where none is idle, the pool
        has room, a slot is free and no other process waits for one; else do nothing. The
        worker boots on its own (an interpreter, NVRTC's load): this returns at once."""
        self._start_idle(wait=False, unless_idle=True)

    def start_ready(self) -> bool:
        """Start one worker, wait until it is ready (worker.wait_ready), and leave it idle for the
        next compile. False where none may start now (the pool is full, or no slot is free):
        the thread asking has no worker of its own. True otherwise, also where the start
        failed: the next compile meets that and reports it, as without this call."""
        return self._start_idle(wait=True, unless_idle=False)

    def _start_idle(self, wait: bool, unless_idle: bool) -> bool:
        """One worker started and checked in idle (add_spare, start_ready): False where none may
        start (no room, no slot free, or ``unless_idle`` and a clean one is idle already)."""
        with self._cond:
            if self.unavailable:
                return True
            if len(self._all) + self._starting >= self.limit:
                return False
            if unless_idle and any(not w.restrict for w in self._idle):
                return False
            self._starting += 1
        try:
            # As if a worker of ours would come back (ours=1): never a wait for a slot, None where none is free.
            worker = self._start(None, 1, time.monotonic(), False)
        except (NoSlot, PoolUnavailable):
            return True
        if worker is None:
            return False
        if wait:
            try:
                worker.wait_ready()
            except Died as died:
                self._drop(worker)
                with self._cond:
                    self.crashes += 1
                if died.foreign:
                    self._give_up(str(died))
                return True
            except BaseException:
                self._drop(worker)
                raise
            with self._cond:
                self.ready = True
        self._checkin(worker)
        return True

    def _died(self, worker: Worker, died: Died, deaths: int) -> None:
        """A worker ended during this compile: PoolUnavailable or WorkerCrashed where it is final."""
        self._drop(worker)
        if died.foreign:  # another kernelcache or NVRTC than ours: no worker started here can be used
            self._give_up(str(died))
            raise PoolUnavailable(str(died)) from None
        with self._cond:
            self.crashes += 1
            self.ready = self.ready or died.started
        if deaths == 2 and not self.ready:
            # Two workers in a row died before they were ready, and none ever was: workers
            # cannot run here (a broken environment); compile in the caller.
            self._give_up(str(died))
            raise PoolUnavailable(str(died)) from None
        if deaths == 2:
            raise WorkerCrashed(f"{died} during this compile, after a retry on a fresh worker") from None

    def _checkout(self, restrict: bool) -> Worker:
        """An idle worker that fits, or a new one started on a slot of the node's."""
        waited_since = time.monotonic()
        while True:
            retire = None
            with self._cond:
                if self.unavailable:
                    raise PoolUnavailable(self.unavailable)
                # restrict=True compiles prefer a worker that ran one (it can do nothing else),
                # and may taint a clean one.
                fits = [w for w in self._idle if w.restrict == restrict] or (self._idle[:] if restrict else [])
                if fits:
                    self._idle.remove(fits[0])
                    return fits[0]
                tainted = [w for w in self._idle if w.restrict]
                if len(self._all) + self._starting >= self.limit and not tainted:
                    self._cond.wait()
                    continue
                if len(self._all) + self._starting >= self.limit:
                    retire = tainted[0]  # make room: a clean compile cannot use it
                    self._idle.remove(retire)
                    self._all.discard(retire)
                ours = len(self._all) + self._starting
                self._starting += 1
            worker = self._start(retire, ours, waited_since, restrict)
            if worker is not None:
                return worker
            with self._cond:  # no slot free, and workers of ours will come back: wait for one
                self._cond.wait(_POLL_S)

    def _start(self, retire: Worker | None, ours: int, waited_since: float, restrict: bool) -> Worker | None:
        """A new worker on a free slot; None where there is none now and a worker of ours will
        come back (or another process waits for a slot while we have some); NoSlot where none is
        free and none of ours will come back; PoolUnavailable where no worker can start here."""
        worker = None
        try:
            if retire is not None:
                retire.close()
            # With workers of ours that will come back, start none while another process waits
            # (the slot one of ours gave up is for it), nor without a slot.
            slot = None if ours and slots.others_wait() else slots.try_take()
            waited = time.monotonic() - waited_since
            if slot is None and slots.enabled():
                if ours and waited < slots.WAIT_S:
                    return None
                if not ours and not restrict:
                    # Every core compiles already (other processes' compiles, say): a worker's
                    # start now would only add to them. The compile waits for a slot in the caller.
                    raise NoSlot()
                slot = slots.take(max(0.0, slots.WAIT_S - waited))  # restrict=True: elsewhere, whatever it waits
            try:
                from kernelcache.keys.toolchain import file_identity, library_file

                found = library_file("nvrtc", load=True)  # ours: loaded here if it was not
                assert found is not None
                nvrtc = (found[0], file_identity(found[0]))
            except Exception as exc:  # no NVRTC here: no worker could compile either
                if slot is not None:
                    slot.release()
                self._give_up(f"cannot start a compiler worker: no libnvrtc here ({exc})")
                raise PoolUnavailable(self.unavailable) from None
            fd, slot = (slot.fd, None) if slot is not None else (-1, None)  # the worker's from here on
            try:
                worker = Worker.start(nvrtc, fd, self.idle_s)
            except Exception as exc:  # no interpreter there, no fds left, ...
                self._give_up(f"cannot start a compiler worker ({sys.executable}): {exc}")
                raise PoolUnavailable(self.unavailable) from None
            return worker
        finally:
            # Also when interrupted (Ctrl-C during the start): the place taken is given back,
            # or the pool would wait for a worker that never comes once all are lost.
            with self._cond:
                self._starting -= 1
                if worker is not None:
                    self._all.add(worker)
                    self.started += 1
                self._cond.notify()

    def _checkin(self, worker: Worker) -> None:
        if slots.others_wait():  # another process waits for a slot: this one's goes to it
            self._drop(worker, kill=False)
            return
        with self._cond:
            self._idle.append(worker)
            self._cond.notify()

    def _drop(self, worker: Worker, kill: bool = True) -> None:
        with self._cond:
            self._all.discard(worker)
            if worker in self._idle:
                self._idle.remove(worker)
            self._cond.notify()
        worker.close(kill=kill)

    def _give_up(self, why: str) -> None:
        with self._cond:
            self.unavailable = self.unavailable or why
            self._cond.notify_all()

    def close(self, kill: bool = False) -> None:
        """End every worker (idle ones at once; ``kill``: all at once; the pool can start new
        ones afterwards)."""
        with self._cond:
            workers, self._idle, self._all = list(self._all), [], set()
        for worker in workers:
            worker.close(kill=kill)


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()
_FORGOTTEN: list[Any] = []


def pool() -> WorkerPool:
    """This process's worker pool (created, not started, on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from kernelcache import config

            config.warn_removed()  # KERNELCACHE_COMPILE_SERVER and its kin, set by habit
            _POOL = WorkerPool(max(2, slots.usable_cores()))
        return _POOL


def _forget_in_child() -> None:
    # After worker.py's own hook (registered first, on import), which closed the workers' pipes.
    global _POOL, _POOL_LOCK
    _POOL_LOCK = threading.Lock()  # another thread may have held it at the fork
    if _POOL is not None:
        _FORGOTTEN.append(_POOL)  # its Popen objects are the parent's to reap: never collected here
        _POOL = None


def _close_at_exit() -> None:
    # Killed, not asked to end: a worker still booting (a spare started for a miss that never
    # came, beside.py) would read its closed pipe only once booted, and the caller's exit would
    # wait for that (0.3-0.4 s measured). A worker writes nothing that outlives it but its
    # reply: killing one, idle or mid-compile of an exiting caller, loses nothing.
    if _POOL is not None:
        _POOL.close(kill=True)


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_close_at_exit)
