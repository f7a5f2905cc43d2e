"""Lock files in a store's locks/: taken with an identity check, removed only under their own lock.

A lock file is an empty file that processes ``flock``. Removing lock files (so that locks/
does not grow by one per key forever) races with lockers, and the check below is what makes
it safe:

1. A locker opens ``k.lock`` (inode 1) and is about to flock it.
2. A remover flocks inode 1 (nobody holds it), unlinks ``k.lock``, releases.
3. The locker's flock on inode 1 now succeeds: it holds a lock on a file no path names.
4. A newcomer creates ``k.lock`` again (inode 2) and locks it: two "holders" of one key.

So every locker, once it holds the flock, compares the fd it locked (fstat) with the file
at the path (lstat); if they differ (or the path is gone) it lets go and starts over. And
a remover unlinks only while it holds the flock itself, and only the file it locked. Then
whoever holds the flock of the file *at the path* is the one holder.

Files are opened read-only (flock needs no write access: in a team cache, members lock files
that another member created) and only as regular files (regular_file.py): a symlink planted
in locks/ must not make us create or lock a file elsewhere, and a FIFO there hung every
compile of its key, ``clear`` and ``verify --fix``; either is unlinked and replaced by a real file.
"""

from __future__ import annotations

import os
import stat
import time
from functools import partial

from kernelcache.regular_file import NotRegularFileError, open_regular
from kernelcache.stores.file.ops import path_in
from kernelcache.stores.file.polling import poll_lock, try_flock
from kernelcache.stores.file.polling import release as release  # how acquire()'s holder lets go

LOCK_SUFFIX = ".lock"
_FLAGS = os.O_RDONLY | os.O_CREAT


def mode_for(locks_dir: str) -> int:
    """The mode of a new lock file in locks_dir: 0600, or 0666 (the umask decides) in a team
    cache (setgid locks/), where every member locks the same files."""
    try:
        return 0o666 if os.stat(locks_dir).st_mode & stat.S_ISGID else 0o600
    except OSError:
        return 0o600


def _open(path: str, mode: int) -> int:
    fd = _open_or_create(path, mode)
    if mode & stat.S_IRGRP:
        # A team cache: the other members must be able to open the file we may have just
        # created, whatever our umask (read access is all that flock needs).
        try:
            st = os.fstat(fd)
            if not st.st_mode & stat.S_IRGRP and st.st_uid == os.getuid():
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_IRGRP)
        except OSError:
            pass
    return fd


def _open_or_create(path: str, mode: int) -> int:
    for attempt in range(2):
        try:
            try:
                return open_regular(path, _FLAGS, mode=mode)[0]
            except FileNotFoundError:
                # locks/ was removed under a live cache: recreate it.
                path_in(os.path.dirname(path), os.path.basename(path))
                return open_regular(path, _FLAGS, mode=mode)[0]
        except NotRegularFileError:
            if attempt:
                raise
            # A symlink, FIFO or socket planted here (never followed, never waited on) is not
            # a lock of ours: remove it (a link, never its target) and create a real one.
            os.unlink(path)
    raise AssertionError("unreachable")


def _is_at_path(fd: int, path: str) -> bool:
    """Whether the file open on fd is still the one the path names (see the module doc)."""
    try:
        st_path = os.lstat(path)
    except FileNotFoundError:
        return False
    st_fd = os.fstat(fd)
    return (st_fd.st_dev, st_fd.st_ino) == (st_path.st_dev, st_path.st_ino)


def acquire(path: str, timeout: float, *, mode: int = 0o600, poll_s: float = 0.01) -> int | None:
    """An fd holding the exclusive flock of the lock file at path; None if still held by
    another at the deadline (``timeout`` 0: one try). release(fd) lets it go.

    OSError when the lock file cannot be created or locked at all (a read-only directory).
    """
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        fd = _open(path, mode)
        try:
            if not poll_lock(partial(try_flock, fd), deadline - time.monotonic(), first_pause=poll_s, max_pause=poll_s):
                os.close(fd)
                return None
            if _is_at_path(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        # Race (module doc, step 3): we locked a file a remover unlinked meanwhile. Let go
        # and lock the file that is at the path now.
        os.close(fd)


def remove_if_idle(path: str) -> bool:
    """Remove the lock file at path if nobody holds it, under its own lock; True if removed."""
    try:
        fd, _ = open_regular(path)
    except FileNotFoundError:
        return False
    except NotRegularFileError:  # a planted symlink, FIFO or socket: not a lock of ours (a directory: unlink refuses)
        os.unlink(path)
        return True
    try:
        if not try_flock(fd):
            return False  # held: its holder is compiling (or evicting) right now
        if not _is_at_path(fd, path):
            return False  # another remover took it and a locker made a new one: not ours
        # Unlinked while we hold its flock: a locker that opened this inode before the
        # unlink gets the flock after us, sees the path no longer names it, and starts over.
        os.unlink(path)
        return True
    finally:
        os.close(fd)


def remove_idle(locks_dir: str) -> int:
    """Remove every lock file in locks_dir that nobody holds; return how many were removed."""
    removed = 0
    try:
        names = os.listdir(locks_dir)
    except FileNotFoundError:
        return 0
    for name in names:
        if not name.endswith(LOCK_SUFFIX):
            continue
        try:
            removed += remove_if_idle(os.path.join(locks_dir, name))
        except OSError:
            continue  # not ours to remove (a team member's, a permission problem): leave it
    return removed
