"""The file operations a file store is built from: whole reads, atomic publication, guarded unlinks.

Each is safe against other processes working in the same directory; why is said where it matters.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

O_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
TMP_SUFFIX = ".tmp"

StatKey = tuple[int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    """Identity of one version of a file: a writer's os.replace changes the inode."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_fd(fd: int, expected: int) -> bytes:
    """Read a whole regular file: usually one read() of ``expected`` + 1 bytes.

    On a regular file a short read means end of file, so one call suffices unless the file
    is longer than expected (then read on: never return a part as if it were all).
    """
    data = os.read(fd, expected + 1)
    if len(data) <= expected:
        return data
    chunks = [data]
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def unlink_if_same(path: str, key: Any) -> int:
    """Unlink path if it is still the file version ``key`` (None: any); return the bytes freed.

    The stat-then-unlink pair leaves a window of microseconds in which another process
    can os.replace a fresh file onto ``path``; we would then delete that fresh entry.
    The cost is one recompile, never a wrong result, so we accept it rather than take a
    lock on every write.
    """
    try:
        st = os.stat(path)
    except OSError:
        return 0
    if key is not None and stat_key(st) != key:
        return 0
    try:
        os.unlink(path)
    except OSError:
        return 0
    return st.st_size


def stage(tmp_dir: str, data: bytes, durable: bool = True) -> str:
    """Write data to a fresh temp file in tmp_dir (fsync'ed if durable), return its path."""
    name = os.path.join(tmp_dir, f"{uuid.uuid4().hex}{TMP_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, 0o600)
    except FileNotFoundError:
        # Someone deleted tmp/ (or the whole format directory) under a live cache: recreate it.
        os.makedirs(tmp_dir, mode=0o700, exist_ok=True)
        fd = os.open(name, flags, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        # fsync before publication: after a power loss the entry is either absent or
        # whole, never an allocated-but-unwritten file with a valid name.
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    os.close(fd)
    return name


def publish(tmp: str, target: str) -> None:
    """Move a staged file onto target atomically (readers see the old file or the new one)."""
    try:
        os.replace(tmp, target)
    except FileNotFoundError:
        if not os.path.exists(tmp):
            raise
        # The two-hex subdirectory does not exist yet (or clear() removed it).
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        os.replace(tmp, target)


def size_of(*paths: str) -> int:
    """Total size of the files that exist among paths."""
    total = 0
    for p in paths:
        try:
            total += os.stat(p).st_size
        except OSError:
            pass
    return total


def path_in(directory: str, name: str) -> str:
    """directory/name, with directory recreated (0700) if someone removed it."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, name)


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
