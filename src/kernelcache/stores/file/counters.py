"""FileStats: a store's counters in a file that every process sharing the cache adds to exactly.

The file is a magic header and one signed 8-byte slot per counter, in ``stats.COUNTERS``
order (new counters are appended, so older files keep their meaning). It also carries the
size cap's tracker (``size_bytes``, ``reconciled_at``).
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
import struct
import threading
import time
import weakref
from collections.abc import Mapping
from functools import partial

from kernelcache import forksafe
from kernelcache.stats import COUNTERS, SLOT_OF, TRACKER, ZEROABLE, MemoryStats, check_names
from kernelcache.stores.file.polling import poll_lock, try_lockf

_SLOT = struct.Struct("<q")
_MAGIC = b"KCSTATS1"
_HEADER = len(_MAGIC)
_FILE_SIZE = _HEADER + _SLOT.size * len(COUNTERS)


# An update holds the file's lock for one pread and one pwrite. A holder that keeps it
# longer is stopped (SIGSTOP, a frozen cgroup) or not ours (in a team cache every member
# can lock the file): after this long the update is skipped (its deltas kept for the next
# one), and for _STUCK_BACKOFF_S the process only tries the lock, never waits for it.
_LOCK_WAIT_S = 5.0
_STUCK_BACKOFF_S = 60.0


def _lock_bounded(fd: int, wait_s: float) -> None:
    """lockf(LOCK_EX) on fd, waiting at most wait_s (0: one try); OSError(ETIMEDOUT) after."""
    if not poll_lock(partial(try_lockf, fd), wait_s):
        raise OSError(errno.ETIMEDOUT, "the counters file stayed locked by another process")


# Every open FileStats, so that deferred counts are written when the interpreter exits (or
# a multiprocessing worker made by fork ends: forksafe.at_exit).
_LIVE: weakref.WeakSet[FileStats] = weakref.WeakSet()
# Deferred counts reach the file at least this often (and at every write, snapshot, close
# and interpreter exit).
_FLUSH_EVERY_S = 0.5


def _flush_all() -> None:
    for stats in list(_LIVE):
        stats.flush()


forksafe.at_exit(_flush_all)


class FileStats:
    """Counters kept in ``path`` and shared, exactly, by every process that opens it.

    Each update is: take an exclusive ``lockf`` lock on the file, ``pread`` all slots,
    ``pwrite`` them back with the deltas applied, unlock. ``lockf`` locks belong to the
    process, so a thread lock serialises this process's threads first. Four system calls
    per update: cheap next to the file I/O that caused it.

    Hits are the hot path, so ``add_deferred`` (hits, misses, bytes read) only adds to a
    per-process pending tally, written out with the next update, snapshot or close, at
    interpreter exit, or after half a second. Counts are exact once every process has
    flushed; a process killed with SIGKILL loses at most its last half second of read
    counts (never a write's, never the size tracker: ``add`` writes through at once).
    A hit never waits: its tally has a lock of its own, never held across I/O, and its
    write-out only tries the file's lock.

    The file is the size tracker of every process sharing it, so a process never leaves it
    once open: an update that cannot take the lock in time (a stopped or foreign holder)
    is skipped, its deltas kept pending for the next one, and what it returns is the file
    as read without the lock plus what is pending. (A process that ends while the holder
    still holds it cannot write its pending deltas: the next reconcile of the size tracker
    corrects what they held.) Only a file that cannot be opened at all (read-only
    directory) makes the counters process memory.
    """

    def __init__(self, path: str | os.PathLike[str], *, shared: bool = False, create: bool = True) -> None:
        self._path = os.fspath(path)
        # A team cache's counters are every member's: the file is group-writable.
        self._shared = shared
        # create=False: a missing file is not created (the process counts in memory).
        self._create = create
        self._thread_lock = threading.Lock()  # one file update at a time in this process
        self._pending_lock = threading.Lock()  # the pending tally; never held across I/O
        self._fallback = MemoryStats()
        self._pending: dict[str, int] = {}
        self._last_flush = time.monotonic()
        self._stuck_until = 0.0  # until then the file's lock is only tried, never waited for
        self._fd: int | None = None
        # close() releases the file; a later use opens it again (a store used after close()
        # keeps its shared counters and its size tracker).
        self._closed = False
        self._open()
        _LIVE.add(self)
        forksafe.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """Fresh locks; the parent's pending tally is the parent's to write (not twice)."""
        self._thread_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending = {}
        self._last_flush = time.monotonic()

    def _open(self) -> None:
        # O_NOFOLLOW: a symlink planted at stats/ must not make us write into the file it
        # points to. Such a link is not ours: replace it (the link, never its target) once.
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        flags |= os.O_CREAT if self._create else 0
        for attempt in range(2):
            try:
                self._fd = os.open(self._path, flags, 0o660 if self._shared else 0o600)
                if self._shared:
                    _make_group_writable(self._fd)
                self._ensure_initialised()
                return
            except OSError as exc:
                self._close_fd()
                if attempt == 0 and exc.errno == errno.ELOOP and _unlink_symlink(self._path):
                    continue
                return

    @property
    def persistent(self) -> bool:
        return self._fd is not None

    def _ensure_initialised(self) -> None:
        # Two processes may create the file at once; the lock makes exactly one of them
        # write the header. A file with another magic (another layout) is restarted from
        # zero: no entry is lost, and size_bytes, the one counter that drives eviction, is
        # rebuilt at once: reconciled_at restarts at zero too, so the next store opened with
        # a size cap rescans the directory (sizecap.py). A file already whole needs
        # no lock (a stopped holder must not keep a store from opening).
        import fcntl

        assert self._fd is not None
        if not stat_mod.S_ISREG(os.fstat(self._fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", self._path)
        head = os.pread(self._fd, _FILE_SIZE, 0)
        if head[:_HEADER] == _MAGIC and len(head) == _FILE_SIZE:
            return
        _lock_bounded(self._fd, _LOCK_WAIT_S)
        try:
            head = os.pread(self._fd, _FILE_SIZE, 0)
            if head[:_HEADER] != _MAGIC:
                os.pwrite(self._fd, _MAGIC + bytes(_FILE_SIZE - _HEADER), 0)
            elif len(head) < _FILE_SIZE:  # written by a version with fewer counters
                os.pwrite(self._fd, bytes(_FILE_SIZE - len(head)), len(head))
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def _read_slots(self, fd: int) -> list[int]:
        raw = os.pread(fd, _FILE_SIZE - _HEADER, _HEADER).ljust(_FILE_SIZE - _HEADER, b"\0")
        return list(struct.unpack(f"<{len(COUNTERS)}q", raw))

    def _read_settled(self, fd: int) -> list[int]:
        """The slots as a whole update left them, read without the lock (a snapshot never waits).

        Race: a read of a regular file is not atomic with respect to another process's pwrite
        into it, so one read can see part of an update (an error counted, its cause not yet).
        A torn read cannot repeat itself (the pwrite of a few hundred bytes finishes between
        two reads), so the slots are read until two reads in a row agree."""
        last = self._read_slots(fd)
        for _ in range(16):
            now = self._read_slots(fd)
            if now == last:
                break
            last = now
        return last

    def _take_pending(self, deltas: Mapping[str, int]) -> dict[str, int]:
        with self._pending_lock:
            merged = dict(deltas)
            for name, value in self._pending.items():
                merged[name] = merged.get(name, 0) + value
            self._pending = {}
            self._last_flush = time.monotonic()
        return merged

    def _keep_pending(self, deltas: Mapping[str, int]) -> None:
        with self._pending_lock:
            for name, value in deltas.items():
                if value:
                    self._pending[name] = self._pending.get(name, 0) + value

    def _pending_view(self, slots: list[int]) -> dict[str, int]:
        """The slots with this process's pending deltas applied (what the file will say)."""
        out = dict(zip(COUNTERS, slots))
        with self._pending_lock:
            for name, value in self._pending.items():
                out[name] = max(0, out[name] + value)
        return out

    def _update(self, deltas: Mapping[str, int], absolute: bool, wait: bool = True) -> dict[str, int] | None:
        """Apply deltas (or set values) in the file; the counters right after. ``wait=False``
        (the hit path): if another thread or process holds a lock, keep the deltas pending
        and return None at once."""
        if not self._thread_lock.acquire(blocking=wait):
            self._keep_pending(deltas)
            return None
        try:
            if self._closed:
                self._reopen()
            if not absolute:
                deltas = self._take_pending(deltas)
            fd = self._fd
            if fd is None:
                return self._fallback_update(deltas, absolute)
            return self._file_update(fd, deltas, absolute, wait)
        finally:
            self._thread_lock.release()

    def _file_update(self, fd: int, deltas: Mapping[str, int], absolute: bool, wait: bool) -> dict[str, int] | None:
        import fcntl

        stuck = time.monotonic() < self._stuck_until
        try:
            _lock_bounded(fd, _LOCK_WAIT_S if wait and not stuck else 0.0)
        except OSError as exc:
            # Skipped, never lost: deltas wait for the next update (a set is dropped: the
            # next reconcile or zero says it again). The file stays this process's counters.
            if exc.errno == errno.ETIMEDOUT and wait and not stuck:
                self._stuck_until = time.monotonic() + _STUCK_BACKOFF_S
            if not absolute:
                self._keep_pending(deltas)
            if not wait:
                return None
            try:
                return self._pending_view(self._read_settled(fd))
            except OSError:
                return self._pending_view([0] * len(COUNTERS))
        try:
            slots = self._read_slots(fd)
            for name, value in deltas.items():
                i = SLOT_OF[name]
                # Counters never go below zero: size_bytes is a tracker that can drift
                # under races, and the next reconcile restores it.
                slots[i] = value if absolute else max(0, slots[i] + value)
            os.pwrite(fd, struct.pack(f"<{len(COUNTERS)}q", *slots), _HEADER)
        except OSError:
            if not absolute:
                self._keep_pending(deltas)
            return None if not wait else self._pending_view([0] * len(COUNTERS))
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        self._stuck_until = 0.0
        return dict(zip(COUNTERS, slots))

    def _fallback_update(self, deltas: Mapping[str, int], absolute: bool) -> dict[str, int]:
        if absolute:
            for name, value in deltas.items():
                self._fallback.set(name, value)
            return self._fallback.snapshot()
        return self._fallback.add(**deltas)

    def add(self, **deltas: int) -> dict[str, int]:
        """Apply the deltas; return the counters as they are right after."""
        check_names(deltas)
        out = self._update(deltas, absolute=False)
        assert out is not None
        return out

    def set(self, name: str, value: int) -> None:
        check_names({name: value})
        self.flush()
        self._update({name: value}, absolute=True)

    def add_deferred(self, **deltas: int) -> None:
        """Count read-path events in memory; written out within half a second, never waiting."""
        with self._pending_lock:
            pending = self._pending
            for name, value in deltas.items():
                pending[name] = pending.get(name, 0) + value
            due = time.monotonic() - self._last_flush > _FLUSH_EVERY_S
            if due:
                self._last_flush = time.monotonic()  # one try per interval while a lock is held
        if due:
            self._update({}, absolute=False, wait=False)

    def zero(self) -> None:
        """Set every counter to 0 for every process sharing the file, except the size tracker.

        This process's pending counts are dropped (they happened before the zero). Another
        process's pending counts (at most its last half second of reads) land afterwards:
        they are counted after the zero, never lost into it.
        """
        with self._pending_lock:
            self._pending = {name: v for name, v in self._pending.items() if name in TRACKER}
        self._update(dict.fromkeys(ZEROABLE, 0), absolute=True)

    def flush(self) -> None:
        """Write pending deferred counts to the file."""
        if self._pending:
            self._update({}, absolute=False)

    def snapshot(self) -> dict[str, int]:
        """The counters now: the file's (read without its lock), plus what this process has
        pending if it could not write that out."""
        self.flush()
        with self._thread_lock:
            if self._closed:
                self._reopen()
            fd = self._fd
            if fd is not None:
                try:
                    return self._pending_view(self._read_settled(fd))
                except OSError:
                    pass
        return self._fallback.snapshot()

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd = None

    def _reopen(self) -> None:
        """Under the thread lock: open the file again after close()."""
        self._closed = False
        self._open()

    def close(self) -> None:
        """Write pending counts and release the file; a later use opens it again."""
        self.flush()
        with self._thread_lock:
            if self._fd is not None:
                self._closed = True
            self._close_fd()

    def __del__(self) -> None:
        # A store dropped without close() still writes its pending counts and frees its fd.
        try:
            self.flush()
            self._close_fd()
        except Exception:
            pass


def _make_group_writable(fd: int) -> None:
    # The umask may have removed the group's bits; only the file's owner can add them back
    # (another member's file is already as its owner made it).
    st = os.fstat(fd)
    want = stat_mod.S_IRGRP | stat_mod.S_IWGRP
    if st.st_mode & want != want and hasattr(os, "getuid") and st.st_uid == os.getuid():
        os.fchmod(fd, stat_mod.S_IMODE(st.st_mode) | want)


def _unlink_symlink(path: str) -> bool:
    """Remove path if it is a symlink (never what it points to); True if one was removed."""
    try:
        if stat_mod.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)
            return True
    except OSError:
        pass
    return False
