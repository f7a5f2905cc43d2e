"""One compile per key at a time: a per-key lock in the process, a per-key file lock across processes.

``single_flight(key, lock_path, timeout)`` is a context manager. Inside it, the caller
re-checks the store and compiles only if the entry is still missing. Its value says how
the wait ended: ``"acquired"`` (we hold the key; compile if still missing), ``"timeout"``
(a peer is taking too long; compile on our own, without the lock). With ``wait=False`` it
does not wait at all: ``"busy"`` means a peer (thread or process) holds the key right now.

Why this is safe against stuck or dead peers:
- the in-process lock is a plain ``threading.Lock`` per key, taken with a timeout;
- the cross-process lock is an ``flock`` on ``locks/<key hex>.lock`` (stores/lockfiles): the
  kernel releases it the moment its holder dies, even by SIGKILL, so waiters get it at once;
  maintenance (clear, prune, verify --fix) removes idle lock files only under their own lock,
  and a locker checks that the file it locked is still the one at the path;
- waiting is bounded by ``timeout`` in total; past it the waiter compiles by itself, so a
  peer that hangs (a stopped process, a dead NFS lock server) never blocks a user forever.
Different keys use different locks and never wait for each other.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from kernelcache import config


class _KeyLocks:
    """Per-key threading locks, created on demand and dropped when nobody holds or waits."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[bytes, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: bytes, timeout: float) -> Iterator[bool]:
        with self._guard:
            lock, users = self._locks.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._locks[key] = (lock, users + 1)
        acquired = lock.acquire(timeout=max(timeout, 0))
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


@contextlib.contextmanager
def single_flight(
    key: bytes, lock_path: str | None, timeout: float | None = None, *, wait: bool = True
) -> Iterator[str]:
    """Hold ``key`` against other threads, and other processes when ``lock_path`` is given.

    Yields "acquired" or "timeout"; with ``wait=False`` (one try, no waiting) "acquired" or
    "busy" (a peer holds the key), or "timeout" when the lock cannot be taken at all (a
    read-only cache directory: compile on your own, as after a timeout). The lock is only
    ever held around "check the store, compile if missing, store": never around anything
    that can wait on another key.
    """
    budget = (config.wait_timeout_s() if timeout is None else timeout) if wait else 0.0
    deadline = time.monotonic() + budget
    with _THREAD_LOCKS.hold(key, budget) as have_thread_lock:
        if not have_thread_lock:
            yield "timeout" if wait else "busy"
            return
        if lock_path is None:
            yield "acquired"
            return
        file_lock = _file_lock(lock_path, deadline)
        if not isinstance(file_lock, _Held):
            yield "busy" if file_lock == "busy" and not wait else "timeout"
            return
        try:
            yield "acquired"
        finally:
            file_lock.release()


def _file_lock(path: str, deadline: float) -> _Held | str | None:
    """An acquired file lock on path; "busy" when a peer still held it at the deadline; None
    when locking failed.

    A lock that cannot be created at all (read-only cache dir) is not a reason to fail:
    we then compile without cross-process coordination.
    """
    from kernelcache.stores.file import locks as lockfiles

    try:
        # The file stays after release (unlinking it on release would race with waiters);
        # tools remove idle ones under their own lock (see stores/lockfiles.py for why the
        # locker's identity check makes that safe).
        fd = lockfiles.acquire(path, deadline - time.monotonic(), mode=lockfiles.mode_for(os.path.dirname(path)))
    except OSError:
        return None
    return "busy" if fd is None else _Held(fd)


class _Held:
    """A held file lock: release() closes the fd, which releases the flock."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def release(self) -> None:
        os.close(self._fd)
