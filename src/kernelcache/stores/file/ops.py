"""The file operations a file store is built from: whole reads, atomic publication, guarded unlinks.

Each is safe against other processes working in the same directory; why is said where it matters.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat as stat_mod
import time
import uuid
from collections.abc import Iterator
from functools import partial

from kernelcache.regular_file import NotRegularFileError as NotRegularFileError  # stores.file.ops.NotRegularFileError
from kernelcache.regular_file import open_regular as open_regular_file
from kernelcache.stores.file.polling import poll_lock, release, try_flock

O_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_NOATIME = getattr(os, "O_NOATIME", 0)
TMP_SUFFIX = ".tmp"
# One read() returns at most about 2 GiB on Linux (0x7ffff000 bytes), whatever is asked:
# bigger files are read in a loop of reads of at most this many bytes.
READ_CHUNK = 1 << 30
PAIR_LOCK_WAIT_S = 5.0  # the most a writer or remover waits for a shard's pair lock (pair_lock)

StatKey = tuple[int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    """Identity of one version of a file: a writer's os.replace changes the inode."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def open_regular(path: str, keep_atime: bool = False) -> tuple[int, os.stat_result]:
    """(fd, fstat) of the regular file at path, opened read-only without following a symlink.

    FileNotFoundError if absent; NotRegularFileError for a symlink or anything but a regular
    file (which could hang or never end a read); other OSErrors as they come. ``keep_atime``:
    open with O_NOATIME where the kernel allows it (the file's owner), since a relatime mount
    moves the atime of a plain read when it is older than the mtime.
    """
    if keep_atime and _O_NOATIME:
        try:
            return open_regular_file(path, os.O_RDONLY | _O_NOATIME)
        except PermissionError:
            pass  # not the owner: O_NOATIME is refused, read plainly
    return open_regular_file(path)


def read_fd(fd: int, size: int, chunk: int = READ_CHUNK) -> bytes:
    """Read ``size`` bytes of a regular file (fewer at its end), at most ``chunk`` per read().

    The caller knows the size from fstat; the content is checked against its sidecar after,
    so a file changed in place shows as a mismatch, never as a part taken for the whole.
    """
    if size <= chunk:
        first = os.read(fd, size)  # the usual case: one call, no copy
        if len(first) == size or not first:
            return first
    else:
        first = b""
    buf = bytearray(size)
    view = memoryview(buf)
    got = len(first)
    view[:got] = first
    while got < size:
        n = os.readv(fd, [view[got : got + chunk]])
        if n == 0:
            break
        got += n
    return bytes(view[:got])


def read_regular(
    path: str, *, max_size: int | None = None, chunk: int = READ_CHUNK, keep_atime: bool = False
) -> tuple[bytes, os.stat_result]:
    """(content, fstat) of the regular file at path (see open_regular for what raises).

    ``max_size``: a bigger file raises NotRegularFileError (it is not what we expect there).
    A read records no use: the LRU stamp is the sidecar's (stores/file/lru.py).
    """
    fd, st = open_regular(path, keep_atime)
    try:
        if max_size is not None and st.st_size > max_size:
            raise NotRegularFileError(errno.EFBIG, f"is {st.st_size} bytes, more than expected there", path)
        return read_fd(fd, st.st_size, chunk), st
    finally:
        os.close(fd)


def starts_with(path: str, magic: bytes) -> bool:
    """Whether path is a regular file (not followed if a symlink) whose content begins with magic."""
    try:
        fd, _ = open_regular(path)
    except OSError:
        return False
    try:
        return os.read(fd, len(magic)) == magic
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_path(path: str) -> bool:
    """Remove a directory tree, or a file or symlink (never followed); False if absent."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat_mod.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return True


def unlink_if_same(path: str, key: StatKey | None, *, inode: int | None = None) -> int | None:
    """Unlink path if it is still the file version ``key`` (None: any) and, given ``inode``,
    still that inode (a directory listing's identity of the file); the bytes freed (``freed``).

    None if nothing was removed (absent, or replaced meanwhile). An unlink that fails for
    another reason (permission, an immutable directory, I/O) raises OSError: "could not
    remove" is never "was absent". The lstat-then-unlink pair leaves a window in which
    another process can os.replace a fresh file onto ``path``; callers that must not lose
    such a file hold the pair lock (see pair_lock), which every writer takes to publish.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if (key is not None and stat_key(st) != key) or (inode is not None and st.st_ino != inode):
        return None
    try:
        os.unlink(path)
    except FileNotFoundError:
        return None
    return freed(st)


def freed(st: os.stat_result) -> int:
    """The bytes unlinking the file of lstat ``st`` gives back: none while another link (a copy
    handed to Triton, or the entry it was linked from) still holds the inode; its last link
    frees them. So the size tracker counts a file's bytes once, whichever of its names goes last."""
    return st.st_size if st.st_nlink <= 1 else 0


@contextlib.contextmanager
def pair_lock(directory: str) -> Iterator[None]:
    """Hold an exclusive flock on ``directory`` (created if missing, see make_dirs).

    An entry and its sidecar are two files, replaced by two renames. Two writers of one key
    without a lock can interleave them (A's sidecar, B's sidecar, B's entry, A's entry) and
    leave an entry whose sidecar describes the other value: a stable mismatch that the next
    reader takes for damage and removes, so the key ends up absent though both writes
    succeeded. Writers, removers and the evictor therefore hold this lock (on the entry's
    shard directory, so no lock file per key) for those few system calls; readers never
    take it. Where flock is not supported (some network filesystems) we go on unlocked.

    The wait is bounded (PAIR_LOCK_WAIT_S): a holder keeps it for a few system calls, so
    one that keeps it longer is stopped (SIGSTOP, a frozen cgroup) or not ours (any member
    of a team cache can flock a shard); then OSError(ETIMEDOUT): a writer drops its write
    with a warning, a remover reports "could not remove", nobody hangs.
    """
    flags = O_RDONLY | O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(directory, flags)
    except FileNotFoundError:
        make_dirs(directory)
        fd = os.open(directory, flags)
    try:
        try:
            held = poll_lock(partial(try_flock, fd), PAIR_LOCK_WAIT_S)
        except OSError:
            held = None  # no flock here: the pre-lock behaviour (a rare race costs one recompile)
        if held is False:
            why = f"its lock was held by another process for over {PAIR_LOCK_WAIT_S:g} s"
            raise OSError(errno.ETIMEDOUT, why, directory)
        yield
    finally:
        release(fd)  # unlocked before the close: a child forked meanwhile holds a copy of fd


def stage(tmp_dir: str, data: bytes, durable: bool = True, mode: int = 0o600) -> str:
    """Write data to a fresh temp file in tmp_dir (fsync'ed if durable), return its path."""
    name, fd = stage_held(tmp_dir, data, durable, mode)
    os.close(fd)
    return name


def stage_held(tmp_dir: str, data: bytes, durable: bool = True, mode: int = 0o600) -> tuple[str, int]:
    """Like stage, but return the path with an fd that holds the file's flock: close it after
    publishing. A staged file whose flock nobody holds belongs to a dead writer (see
    sweep_dead_temps). ``mode``: the file's permissions (0666 in a team cache: the umask
    decides, as for any file a member creates).
    """
    name = os.path.join(tmp_dir, f"{uuid.uuid4().hex}{TMP_SUFFIX}")
    # Born under another name, renamed to *.tmp only once flocked: so a *.tmp file without
    # a flock is always a dead writer's (see sweep_dead_temps). Created and locked in one
    # step is not possible; without this rename a sweeper could take a live writer's file
    # in the moment between its O_CREAT and its flock (a descheduled writer makes that
    # moment long: it happened under load in test_sweeping_never_takes_a_live_writers_staged_file).
    born = name + _BORN_SUFFIX
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(born, flags, mode)
    except FileNotFoundError:
        # Someone deleted tmp/ (or the whole format directory) under a live cache: recreate it.
        make_dirs(tmp_dir)
        fd = os.open(born, flags, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(born, name)
        born = ""
        # Full size at once (sparse): a size-cap rescan that counts tmp/ while we write sees
        # what this write reserved, not the part written so far (sizecap._rescan).
        os.ftruncate(fd, len(data))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        # fsync before publication: after a power loss the entry is either absent or
        # whole, never an allocated-but-unwritten file with a valid name.
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(born or name)
        raise
    return name, fd


# A staged file's name while it is being created, before its flock (swept by age only).
_BORN_SUFFIX = ".new"


def sweep_dead_temps(tmp_dir: str, max_age_s: float, *, remove: bool = True) -> list[tuple[str, int]]:
    """(path, size) of every leftover in tmp_dir, removed unless ``remove`` is False.

    A leftover is a staged file (``*.tmp``) that no live writer holds (its flock is free),
    or any other file (a header trace of a killed compile) older than ``max_age_s``. A live
    writer's file is never one: it holds the flock from creation to publication.
    """
    found = []
    now = time.time()
    try:
        with os.scandir(tmp_dir) as it:
            files = list(it)
    except OSError:
        return found
    for f in files:
        try:
            st = f.stat(follow_symlinks=False)
            if not f.name.endswith(TMP_SUFFIX) or not stat_mod.S_ISREG(st.st_mode):
                if now - st.st_mtime > max_age_s:
                    found.append((f.path, st.st_size))
                    if remove:
                        os.unlink(f.path)
                continue
            if _take_if_dead(f.path, remove):
                found.append((f.path, st.st_size))
        except OSError:
            continue  # vanished (published meanwhile) or not ours to remove
    return found


def _take_if_dead(path: str, remove: bool) -> bool:
    """Whether the staged file at path has no live writer (and unlink it if ``remove``)."""
    fd, _ = open_regular_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live writer holds it
        # Race: the writer may have published it (renamed it away) and released its flock
        # between our open and our flock: then the path no longer names this file.
        st_fd, st_path = os.fstat(fd), os.lstat(path)
        if (st_fd.st_dev, st_fd.st_ino) != (st_path.st_dev, st_path.st_ino):
            return False
        if remove:
            os.unlink(path)
        return True
    finally:
        os.close(fd)


def publish(tmp: str, target: str) -> None:
    """Move a staged file onto target atomically (readers see the old file or the new one)."""
    try:
        os.replace(tmp, target)
    except FileNotFoundError:
        if not os.path.exists(tmp):
            raise
        # The two-hex subdirectory does not exist yet (or clear() removed it).
        make_dirs(os.path.dirname(target))
        os.replace(tmp, target)


def size_of(*paths: str) -> int:
    """The bytes the files that exist among paths would give back (``freed``: a file another
    link still holds gives none back)."""
    total = 0
    for p in paths:
        try:
            total += freed(os.lstat(p))
        except OSError:
            pass
    return total


def path_in(directory: str, name: str) -> str:
    """directory/name, with directory recreated (see make_dirs) if someone removed it."""
    make_dirs(directory)
    return os.path.join(directory, name)


def make_dirs(path: str) -> None:
    """os.makedirs for a directory inside a store's tree: each new one gets its parent's mode,
    less others' write permission.

    So a private cache's directories are 0700 like its root, and a team cache's are
    group-writable and setgid like its root, whatever the umask (mkdir masks the mode
    with it, hence the chmod).
    """
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_dirs(parent)
    # Never others' write (nor the sticky bit) from a parent: a directory kernelcache makes
    # is its own, even under a parent that everyone can write.
    mode = stat_mod.S_IMODE(os.stat(parent).st_mode) & ~0o1002
    try:
        os.mkdir(path, mode & 0o777)
    except FileExistsError:
        return
    if mode != 0o700:
        os.chmod(path, mode)


def scan_shards(root: str) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
    """Every file in the subdirectories of root, with its lstat; vanishing files are skipped."""
    try:
        shards = list(os.scandir(root))
    except FileNotFoundError:
        return
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):
            continue
        try:
            files = list(os.scandir(shard.path))
        except FileNotFoundError:
            continue
        for f in files:
            try:
                yield f, f.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
