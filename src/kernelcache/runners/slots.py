"""The node's compile budget: one slot per usable core, shared by every process of this user here.

A compile holds a slot while it runs: a compile in the caller's process for that compile, and a
compiler worker for its whole life (its slot's locked file is passed to it and closed here: the
lock is the worker's). So the compiles running on the node never outnumber its cores, and P
processes never run more than N compiler processes, however many call compile_many at once.

Why files and flock: the lock goes with its holder's open file, so a slot of a process that died
(killed, out of memory) is free the moment it is gone, with nobody to clean up, and no daemon
keeps the count. Measured against a shared pool (the compile server this replaced, whose warm
workers paid NVRTC's start before they were needed) in README's "Compile workers".

Where: ``$XDG_RUNTIME_DIR/kernelcache`` where that is this euid's (the XDG spec), else
``<tmp>/kernelcache-<euid>``; used only if it is a directory of ours closed to others (0700):
whoever can put a file there could hold our slots. Containers that share it (the same /tmp or
runtime dir, the same uid) share one budget; containers that do not have one each.

N (usable_cores): the CPUs this process may run on (sched_getaffinity), and no more than a
cgroup v2 CPU quota allows (cpu.max of this cgroup and its parents, rounded up): a container
limited to 4 CPUs on a 64-core host gets 4 slots.

Every wait is bounded: a holder that is stopped (SIGSTOP, a debugger) never hangs anyone; past
WAIT_S the compile runs without a slot, with one warning. A process that waits tells the others
(a read lock on ``waiting``); a worker that ends a compile while another process waits retires,
so a batch of one process does not keep another's single compile waiting for its end.
"""

from __future__ import annotations

import fcntl
import functools
import math
import os
import random
import stat
import struct
import threading
import time

from kernelcache import forksafe
from kernelcache.log import WarnOnce

__all__ = [
    "WAIT_S",
    "Slot",
    "enabled",
    "others_wait",
    "runtime_dir",
    "take",
    "try_take",
    "usable_cores",
    "waiting_path",
]

WAIT_S = 10.0  # the longest a compile waits for a slot; then it runs without one (one warning)
_POLL_S = (0.001, 0.01)  # a waiter tries every slot again after this long, doubling up to the second
_warned = WarnOnce()


@functools.cache
def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, quota)) if quota else cores


def _cgroup_quota() -> int | None:
    """The smallest cpu.max quota of this process's cgroup v2 and its parents, in whole CPUs."""
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if rel is None:
        return None  # cgroup v1 only: no quota read
    best = None
    path = os.path.normpath("/sys/fs/cgroup/" + rel.lstrip("/"))
    while path.startswith("/sys/fs/cgroup"):
        try:
            with open(os.path.join(path, "cpu.max")) as f:
                quota, period = f.read().split()[:2]
            if quota != "max":
                cpus = math.ceil(int(quota) / int(period))
                best = cpus if best is None else min(best, cpus)
        except (OSError, ValueError):
            pass
        if path == "/sys/fs/cgroup":
            break
        path = os.path.dirname(path)
    return best


def runtime_dir() -> str | None:
    """This user's runtime directory for kernelcache, created if absent, when it is ours and
    closed to others; else None, with one warning (compiles then run without the node's budget)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and _owned(runtime):
        path = os.path.join(runtime, "kernelcache")
    else:  # under sudo it may name the user's: root's slots do not move in there
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"kernelcache-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        _warned.warn(f"dir-{path}", f"compile slots not used: cannot create {path} ({exc})", stacklevel=4)
        return None
    try:
        st = os.lstat(path)
    except OSError as exc:
        _warned.warn(f"dir-{path}", f"compile slots not used: {path}: {exc}", stacklevel=4)
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        # Never chmod or remove it: it may be somebody else's (a planted directory, a team's).
        _warned.warn(
            f"dir-{path}",
            f"compile slots not used: {path} is not a directory of uid {os.geteuid()} closed to others "
            f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it or set XDG_RUNTIME_DIR",
            stacklevel=4,
        )
        return None
    return path


def _owned(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return False


class Slot:
    """One held slot: its locked file. ``release`` frees it; ``fd`` goes to a worker that keeps it."""

    def __init__(self, fd: int, index: int) -> None:
        self.fd, self.index = fd, index

    def release(self) -> None:
        """Unlock, then close. Unlocked explicitly: a child forked meanwhile holds a copy of the
        open file, and the lock would stay held as long as that child lives."""
        if self.fd >= 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1


def enabled() -> bool:
    """Whether this node's budget is kept here (a usable runtime directory)."""
    return _slot_dir() is not None


def try_take() -> Slot | None:
    """A free slot now, or None (all held, or no usable runtime directory: see ``take``)."""
    folder = _slot_dir()
    if folder is None:
        return None
    count = usable_cores()
    first = random.randrange(count)  # processes starting together do not all try slot 0 first
    for n in range(count):
        index = (first + n) % count
        try:
            fd = os.open(os.path.join(folder, str(index)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        return Slot(fd, index)
    return None


def take(bound: float = WAIT_S) -> Slot | None:
    """A slot, waiting for one to free up ``bound`` seconds at most; None past it (one warning:
    the compile runs without one) or where the node has no usable runtime directory."""
    slot = try_take()
    if slot is not None or _slot_dir() is None:
        return slot
    deadline, pause = time.monotonic() + bound, _POLL_S[0]
    with _Waiting():
        while time.monotonic() < deadline:
            time.sleep(pause)
            slot = try_take()
            if slot is not None:
                return slot
            pause = min(pause * 2, _POLL_S[1])
    _warned.warn(
        "slot-wait",
        f"every one of this node's {usable_cores()} compile slots stayed held for {bound:g} s (a stopped or "
        "hung process?); compiling without one",
        stacklevel=4,
    )
    return None


_dir_checked: dict[str, str | None] = {}  # XDG_RUNTIME_DIR -> the checked slot folder


def _slot_dir() -> str | None:
    key = os.environ.get("XDG_RUNTIME_DIR", "")
    if key not in _dir_checked:
        root = runtime_dir()
        folder = None if root is None else os.path.join(root, "slots")
        if folder is not None:
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass
            except OSError:
                folder = None
        _dir_checked[key] = folder
    return _dir_checked[key]


# -- "some process waits": a read lock on <slots>/waiting while it does ---------------------------
# Open-file-description locks (fcntl F_OFD_*): they conflict between open files only, so this
# process's own waiters never count as "others", and F_OFD_GETLK tests for another's lock without
# taking one (a test that took a lock, even for a moment, would look like a waiter to the others).
_wait_lock = threading.Lock()
_wait_fd = -1
_waiters = 0  # this process's threads waiting now
_FLOCK = struct.Struct("@hhqqi4x")  # struct flock: l_type, l_whence, l_start, l_len, l_pid


def _ofd_lock(fd: int, kind: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))


def held_elsewhere(fd: int) -> bool:
    """Whether an open file other than ``fd``'s holds a lock on ``fd``'s file (a waiter)."""
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError:
        return False
    return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)


class _Waiting:
    def __enter__(self) -> None:
        global _wait_fd, _waiters
        with _wait_lock:
            if _wait_fd < 0:
                _wait_fd = open_waiting()
            _waiters += 1
            if _waiters == 1 and _wait_fd >= 0:
                _ofd_lock(_wait_fd, fcntl.F_RDLCK)

    def __exit__(self, *exc: object) -> None:
        global _waiters
        with _wait_lock:
            _waiters -= 1
            if _waiters == 0 and _wait_fd >= 0:
                _ofd_lock(_wait_fd, fcntl.F_UNLCK)


def waiting_path() -> str:
    """The file whose read lock says "a process waits for a slot" ("" where slots are not kept)."""
    folder = _slot_dir()
    return "" if folder is None else os.path.join(folder, "waiting")


def open_waiting(path: str | None = None) -> int:
    """An open file of ``path`` (default: waiting_path()), created if absent; -1 where it cannot be."""
    path = waiting_path() if path is None else path
    if not path:
        return -1
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1


def others_wait() -> bool:
    """Whether another process waits for a slot now (this process's own waiters never count)."""
    global _wait_fd
    with _wait_lock:
        if _wait_fd < 0:
            _wait_fd = open_waiting()
        return _wait_fd >= 0 and held_elsewhere(_wait_fd)


def _reset_in_child() -> None:
    # A forked child: the parent's waiters are not ours, nor its lock on ``waiting`` (the same
    # open file: unlocking it here would unlock the parent's); a fresh one is opened if needed.
    # (OFD locks are not the process's: a child holding a copy keeps the parent's lock only as
    # long as the parent does, since the parent unlocks it explicitly.)
    global _wait_lock, _wait_fd, _waiters
    _wait_lock, _waiters = threading.Lock(), 0
    if _wait_fd >= 0:
        os.close(_wait_fd)  # closing our copy leaves the parent's lock as it is (flock: per open file)
    _wait_fd = -1


forksafe.reset_function_in_child(_reset_in_child)
