"""The bounded lock poll: every lock of the file store that could be held by a stopped or
foreign process is tried without blocking, again and again, until a deadline.

A blocking ``flock``/``lockf`` would wait as long as the holder lives: a process stopped with
SIGSTOP, or another member of a team cache, could then hang every compile. Polling with a
non-blocking try bounds the wait; the pause between tries grows so that a lock released
at once is taken at once, and a long wait costs few system calls.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable


def poll_lock(
    try_lock: Callable[[], bool], timeout: float, *, first_pause: float = 0.0005, max_pause: float = 0.02
) -> bool:
    """Call ``try_lock()`` until it returns True (then True), or until ``timeout`` seconds have
    passed (then False); it is tried at least once. Its OSError propagates."""
    deadline, pause = time.monotonic() + max(timeout, 0.0), first_pause
    while True:
        if try_lock():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, max_pause)


def try_flock(fd: int) -> bool:
    """One non-blocking exclusive flock of fd: False when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def try_lockf(fd: int) -> bool:
    """One non-blocking exclusive lockf (a POSIX record lock) of fd: False when another process holds it."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return False
    return True


def release(fd: int) -> None:
    """Let go of an flock held through fd (locks.acquire, ops.pair_lock): unlock it, then close fd.

    Race: a fork by another thread while the lock is held gives the child a copy of the fd,
    and an flock belongs to the open file, which that copy keeps open: closing our fd alone
    would leave the lock held until the child exits (a fork-started helper: for good), and
    every waiter waits out its budget (a key's compile, a shard's writes). An unlock through
    any copy releases it.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass  # closing releases it as well, where no copy exists
    finally:
        os.close(fd)
