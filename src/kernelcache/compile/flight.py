"""Single flight: one compile per key at a time, across threads, processes and hosts.

``SingleFlight`` holds one key's three locks, always taken in this order and released in
the reverse one:

1. the thread lock: a ``threading.Lock`` per key in this process;
2. the file lock: an ``flock`` on the store's ``locks/<key hex>.lock`` (stores.file.locks),
   shared by the processes of this host;
3. the remote lock: the store's lock on a server every host shares (a Redis tier).

The remote lock is taken inside the file lock and released before it. That order is what
lets a waiter of this host take over at once a remote lock left by a dead holder of this
host: whoever holds that remote lock under our local id took it while holding the file
lock we hold now, so it is not running any more (stores.redis.lock).

After each lock it takes, the flight asks ``ready()`` whether a peer published the result
meanwhile; "ready" then means: read it, do not compile. "acquired" means: every lock the
store offers is ours and the result is still missing: compile it. "timeout": a peer took
longer than the budget, or a lock cannot be had at all (a read-only cache directory):
compile on your own, without the lock. ``try_hold`` makes one try of each lock instead of
waiting and yields "busy" when a peer holds the key.

Why this is safe against stuck or dead peers: the kernel releases an flock the moment its
holder dies, even by SIGKILL, so waiters get it at once (a holder unlocks before it closes:
a child it forked meanwhile holds a copy of the fd, which would keep the lock); maintenance (clear, prune, verify
--fix) removes idle lock files only under their own lock, and a locker checks that the file
it locked is still the one at the path; a remote lock expires within its TTL once its
holder stops refreshing it; and waiting is bounded by the budget in total, so a peer that
hangs (a stopped process, a dead NFS lock server) never blocks a caller forever. The locks
are held only around "check the store, compile if missing, store", never around anything
that waits on another key; different keys never wait for each other.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from kernelcache import config, forksafe
from kernelcache.stores.file import locks as lockfiles

if TYPE_CHECKING:
    from kernelcache.stores.base import ProgramCacheResource

ACQUIRED, READY, TIMEOUT, BUSY = "acquired", "ready", "timeout", "busy"


def _never() -> bool:
    return False


class _KeyLocks:
    """Per-key threading locks, created on demand and dropped when nobody holds or waits."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[bytes, tuple[threading.Lock, int]] = {}
        forksafe.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """The parent's holders are not in the child: their locks must not be waited for."""
        self._guard = threading.Lock()
        self._locks = {}

    @contextlib.contextmanager
    def hold(self, key: bytes, timeout: float) -> Iterator[bool]:
        with self._guard:
            lock, users = self._locks.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._locks[key] = (lock, users + 1)
        # -1: no timeout (Lock.acquire refuses inf, the "wait forever" budget).
        acquired = lock.acquire(timeout=-1 if timeout == math.inf else max(timeout, 0))
        try:
            yield acquired
        finally:
            if acquired:
                lock.release()
            with self._guard:
                _, users = self._locks[key]
                if users == 1:
                    del self._locks[key]  # the last user: do not grow the table forever
                else:
                    self._locks[key] = (lock, users - 1)


_THREAD_LOCKS = _KeyLocks()


class SingleFlight:
    """The single flight of one key: ``with SingleFlight.for_store(store, key).hold(ready) as outcome``.

    ``lock_path``: the file lock shared by this host's processes (None: threads only).
    ``store``: whose remote lock to take, when it offers one. ``budget``: seconds a waiter
    waits in all (default ``KERNELCACHE_WAIT_TIMEOUT``).
    """

    def __init__(
        self,
        key: bytes,
        budget: float | None = None,
        *,
        lock_path: str | None = None,
        store: ProgramCacheResource | None = None,
    ) -> None:
        self.key = key
        self.budget = config.wait_timeout_s() if budget is None else budget
        self.lock_path = lock_path
        self._store = store

    @classmethod
    def for_store(cls, store: ProgramCacheResource, key: bytes, budget: float | None = None) -> SingleFlight:
        """The flight of ``key`` with every lock ``store`` declares (its file lock, its remote lock)."""
        try:
            lock_path = store.lock_path(key.hex() + lockfiles.LOCK_SUFFIX)
        except OSError:
            lock_path = None  # a locks/ directory that cannot be made: threads only
        return cls(key, budget, lock_path=lock_path, store=store)

    def hold(self, ready: Callable[[], bool] = _never) -> contextlib.AbstractContextManager[str]:
        """Wait (the budget at most) for the key; yields "acquired", "ready" or "timeout"."""
        return self._hold(ready, wait=True)

    def try_hold(self, ready: Callable[[], bool] = _never) -> contextlib.AbstractContextManager[str]:
        """One try of each lock; yields "acquired", "ready", "busy" (a peer holds it) or "timeout"."""
        return self._hold(ready, wait=False)

    @contextlib.contextmanager
    def _hold(self, ready: Callable[[], bool], wait: bool) -> Iterator[str]:
        budget = self.budget if wait else 0.0
        deadline = time.monotonic() + budget
        with _THREAD_LOCKS.hold(self.key, budget) as have_thread_lock:
            if not have_thread_lock:
                yield TIMEOUT if wait else BUSY
                return
            with self._file_lock(deadline) as local:
                if local == BUSY and not wait:
                    yield BUSY
                    return
                held = local == ACQUIRED
                if held and ready():
                    yield READY
                    return
                with self._remote_lock(deadline, ready, held) as remote:
                    if remote == TIMEOUT and not wait:
                        yield BUSY  # another host is compiling it: come back to it later
                    elif remote == READY or (remote == ACQUIRED and ready()):
                        yield READY
                    elif remote == ACQUIRED or (held and remote == "unavailable"):
                        yield ACQUIRED
                    else:
                        yield TIMEOUT

    @contextlib.contextmanager
    def _file_lock(self, deadline: float) -> Iterator[str]:
        """ "acquired" (or no file lock to take), "busy" (a peer held it at the deadline), or
        "timeout" when it cannot be taken at all (a read-only cache directory: we then compile
        without cross-process coordination rather than fail)."""
        if self.lock_path is None:
            yield ACQUIRED
            return
        try:
            # The file stays after release (unlinking it on release would race with waiters);
            # maintenance removes idle ones under their own lock (stores.file.locks says why
            # the locker's identity check makes that safe).
            fd = lockfiles.acquire(
                self.lock_path,
                deadline - time.monotonic(),
                mode=lockfiles.mode_for(os.path.dirname(self.lock_path)),
            )
        except OSError:
            yield TIMEOUT
            return
        if fd is None:
            yield BUSY
            return
        try:
            yield ACQUIRED
        finally:
            lockfiles.release(fd)

    def _remote_lock(
        self, deadline: float, ready: Callable[[], bool], held: bool
    ) -> contextlib.AbstractContextManager[str]:
        """The store's remote lock: "acquired", "ready", "timeout" or "unavailable" (none offered)."""
        if self._store is None or not self._store.has_remote_lock:
            return contextlib.nullcontext("unavailable")
        # Only a file lock we hold proves a remote lock under our local id was left by a dead
        # holder (the module doc); after a file-lock timeout we claim no local id.
        local = self.lock_path if held else None
        return self._store.remote_lock(self.key.hex(), deadline, ready, local_lock=local)
