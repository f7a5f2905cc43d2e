"""The node's compile budget: one slot per usable core, shared by every process of this user here.

A compile holds a slot while it runs: one in the caller's process for that compile, a compiler
worker for its whole life (its slot's locked file is passed to it). So the compiles on a node never
outnumber its cores. A slot is a file locked with flock: the lock goes with its holder, so the slot
of a process that died is free at once, with nobody to clean up and no daemon to keep count.

Where: ``$XDG_RUNTIME_DIR/kernelcache/slots`` where that directory is this euid's (the XDG spec),
else ``<tmp>/kernelcache-<euid>/slots``, used only if it is a directory of ours closed to others
(0700): whoever can put a file there could hold our slots. Containers that share it (the same
/tmp or runtime directory, the same uid) share one budget; containers that do not have one each.
N (usable_cores): the CPUs this process may run on, capped by a cgroup v2 CPU quota (cpu.max of
its cgroup and their parents, rounded up): a container limited to 4 CPUs of 64 gets 4 slots.

Waits are bounded: past WAIT_S (a holder stopped by SIGSTOP or a debugger) the compile runs
without a slot, with one warning. A process that waits says so (a read lock on ``waiting``):
workers of other processes then end, idle or after their compile, and their slots go to it.
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

__all__ = ["WAIT_S", "Slot", "enabled", "free_now", "held_elsewhere", "others_wait", "take", "try_take"]
__all__ += ["batches_now", "join_batches", "usable_cores"]

WAIT_S = 10.0  # the longest a compile waits for a slot; then it runs without one (one warning)
_POLL_S = (0.001, 0.005)  # a waiter tries every slot again after this long, doubling up to the second
_warned = WarnOnce()


@functools.cache
def usable_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quotas = []
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((line[3:].strip() for line in f if line.startswith("0::")), "")
        path = os.path.normpath("/sys/fs/cgroup/" + rel.lstrip("/")) if rel else ""
    except OSError:
        path = ""  # no cgroup v2: no quota read
    while path.startswith("/sys/fs/cgroup"):
        try:
            with open(os.path.join(path, "cpu.max")) as f:
                quota, period = f.read().split()[:2]
            if quota != "max":
                quotas.append(math.ceil(int(quota) / int(period)))
        except (OSError, ValueError):
            pass
        path = "" if path == "/sys/fs/cgroup" else os.path.dirname(path)
    return max(1, min([cores, *quotas]))


def _checked_dir() -> str | None:
    """The slots' directory, created if absent, when it is ours and closed to others; else None
    with one warning (compiles then run without the node's budget)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.geteuid():
        root = os.path.join(runtime, "kernelcache")
    else:  # under sudo it may name the user's: root's slots do not move in there
        import tempfile

        root = os.path.join(tempfile.gettempdir(), f"kernelcache-{os.geteuid()}")
    for path in (root, os.path.join(root, "slots")):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            _warned.warn(f"dir-{path}", f"compile slots not used: cannot create {path} ({exc})", stacklevel=5)
            return None
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            # Never chmod or remove it: it may be somebody else's (a planted directory, a team's).
            _warned.warn(
                f"dir-{path}",
                f"compile slots not used: {path} is not a directory of uid {os.geteuid()} closed to others "
                f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it or set XDG_RUNTIME_DIR",
                stacklevel=5,
            )
            return None
    return os.path.join(root, "slots")


_dirs: dict[str, str | None] = {}  # XDG_RUNTIME_DIR -> the checked slots' directory


def _slot_dir() -> str | None:
    key = os.environ.get("XDG_RUNTIME_DIR", "")
    if key not in _dirs:
        _dirs[key] = _checked_dir()
    return _dirs[key]


def enabled() -> bool:
    """Whether the node's budget is kept here (a usable slots' directory)."""
    return _slot_dir() is not None


def _open(name: str) -> int:
    folder = _slot_dir()
    if folder is None:
        return -1
    try:
        return os.open(os.path.join(folder, name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return -1


class Slot:
    """One held slot: its locked file. ``release`` frees it; ``fd`` may go to a worker instead."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        """Unlock, then close. Unlocked explicitly: a child forked meanwhile holds a copy of the
        open file, and the lock would stay held as long as that child lives."""
        if self.fd >= 0:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1


def try_take() -> Slot | None:
    """A free slot now, or None (all held, or no usable slots' directory: see ``take``)."""
    count = usable_cores()
    first = random.randrange(count)  # processes starting together do not all try slot 0 first
    for n in range(count):
        fd = _open(str((first + n) % count))
        if fd < 0:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Slot(fd)
        except OSError:
            os.close(fd)
    return None


def free_now() -> int:
    """How many slots are free this moment (each taken and let go at once; the node's count where
    its budget is not kept). A moment's view: others may take them the next."""
    if not enabled():
        return usable_cores()
    held = []
    while (slot := try_take()) is not None:
        held.append(slot)
    for slot in held:
        slot.release()
    return len(held)


def join_batches() -> Slot | None:
    """Say that a batch runs in this process (compile_many's default choice): a lock on one of
    ``<slots>/batch-<n>``, held until released (with the process at the latest); None where all
    are held or the node's budget is not kept. Open-file-description locks, as for ``waiting``:
    batches_now tests them without taking one (a test that took one, even for a moment, would
    look like a batch to a process counting at that moment)."""
    for n in range(usable_cores()):
        fd = _open(f"batch-{n}")
        if fd < 0:
            return None
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            return _Presence(fd)
        except OSError:
            os.close(fd)
    return None


class _Presence(Slot):
    def release(self) -> None:
        if self.fd >= 0:
            try:  # unlocked first: a child forked meanwhile holds the same open file (see Slot)
                fcntl.fcntl(self.fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0))
            finally:
                os.close(self.fd)
                self.fd = -1


def batches_now() -> int:
    """How many batches run on the node now, this process's included (join_batches; a moment's
    view). 1 where the node's budget is not kept."""
    count = 0
    for n in range(usable_cores()):
        fd = _open(f"batch-{n}")
        if fd < 0:
            return 1
        try:
            count += held_elsewhere(fd)
        finally:
            os.close(fd)
    return max(1, count)


def take(bound: float = WAIT_S) -> Slot | None:
    """A slot, waiting ``bound`` seconds at most for one to free up; None past it (one warning:
    the compile runs without one) or where the node's budget is not kept."""
    slot = try_take()
    if slot is not None or not enabled():
        return slot
    deadline, pause = time.monotonic() + bound, _POLL_S[0]
    _waiting(+1)
    try:
        while time.monotonic() < deadline:
            time.sleep(pause)
            slot = try_take()
            if slot is not None:
                return slot
            pause = min(pause * 2, _POLL_S[1])
    finally:
        _waiting(-1)
    _warned.warn(
        "slot-wait",
        f"every one of this node's {usable_cores()} compile slots stayed held for {bound:g} s (a stopped or "
        "hung process?); compiling without one",
        stacklevel=4,
    )
    return None


# "Some process waits": a read lock on <slots>/waiting while one does. Open-file-description
# locks (fcntl F_OFD_*): they conflict between open files only, so this process's own waiters
# (one open file for all its threads) never count as "others", and F_OFD_GETLK tests for another
# open file's lock without taking one (a test that took one, even for a moment, would look like a
# waiter to the others).
_FLOCK = struct.Struct("@hhqqi4x")  # struct flock: l_type, l_whence, l_start, l_len, l_pid
_wait_lock = threading.Lock()
_wait_fd, _wait_dir = -1, ""  # this process's open file of <_wait_dir>/waiting
_waiters = 0  # this process's threads waiting now


def _wait_file() -> int:
    """This process's open file of the waiting file of the slots in use now (under _wait_lock)."""
    global _wait_fd, _wait_dir
    folder = _slot_dir() or ""
    if folder != _wait_dir and not _waiters:  # XDG_RUNTIME_DIR changed (a test's, say): that folder's
        if _wait_fd >= 0:
            os.close(_wait_fd)
        _wait_fd, _wait_dir = _open("waiting"), folder
    return _wait_fd


def _waiting(change: int) -> None:
    global _waiters
    with _wait_lock:
        _wait_file()
        _waiters += change
        if _wait_fd >= 0 and _waiters == (1 if change > 0 else 0):
            kind = fcntl.F_RDLCK if change > 0 else fcntl.F_UNLCK
            fcntl.fcntl(_wait_fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0))


def held_elsewhere(fd: int) -> bool:
    """Whether an open file other than ``fd``'s holds a lock on ``fd``'s file (a waiter)."""
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError:
        return False
    return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)


def waiting_path() -> str:
    """The file whose read lock says that a process waits for a slot ("" where none is kept)."""
    folder = _slot_dir()
    return "" if folder is None else os.path.join(folder, "waiting")


def others_wait() -> bool:
    """Whether another process waits for a slot now (this process's own waiters never count)."""
    with _wait_lock:
        fd = _wait_file()
        return fd >= 0 and held_elsewhere(fd)


def _reset_in_child() -> None:
    # A forked child: the parent's waiters are not its own, nor the parent's lock on ``waiting``
    # (the same open file: unlocking it here would unlock the parent's); it opens its own.
    global _wait_lock, _wait_fd, _wait_dir, _waiters
    _wait_lock, _waiters = threading.Lock(), 0
    if _wait_fd >= 0:
        os.close(_wait_fd)  # our copy only: the parent's lock stays as it is
    _wait_fd, _wait_dir = -1, ""


forksafe.reset_function_in_child(_reset_in_child)
