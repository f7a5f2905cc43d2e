"""Opening a file that somebody else may have put there: only a regular file, never waiting.

Every file kernelcache opens at a path it does not fully control (entries, locks and markers in
a cache tree, bundles, recorded header paths, the lockfile) is opened here, by one rule:
- O_NONBLOCK: open() of a FIFO waits for the other end (forever, if nobody comes); with it the
  open returns at once, and the fstat below refuses what is not a regular file. A device, a
  socket or a directory is refused the same way. On a regular file O_NONBLOCK changes nothing.
- O_NOFOLLOW unless ``follow``: inside a tree of ours a symlink is not ours (an entry linked to
  /dev/zero or to another user's file); paths a user names (a header, a bundle) may be links.
- O_CLOEXEC: no child process inherits the descriptor.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat

__all__ = ["NotRegularFileError", "open_regular", "read_regular"]

_ALWAYS = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class NotRegularFileError(OSError):
    """A FIFO, device, directory, socket or (without ``follow``) symlink where a file was expected."""


def open_regular(
    path: str, flags: int = os.O_RDONLY, *, follow: bool = False, mode: int = 0o600
) -> tuple[int, os.stat_result]:
    """``(fd, fstat)`` of the regular file at ``path``, opened with ``flags`` (O_CREAT with ``mode``).

    NotRegularFileError (errno ELOOP for a symlink, EINVAL for anything else) for what is not a
    regular file, closed again; other OSErrors (FileNotFoundError, PermissionError) as open raises them.
    """
    try:
        fd = os.open(path, flags | _ALWAYS | (0 if follow else _NOFOLLOW), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise NotRegularFileError(errno.ELOOP, "is a symlink, not a regular file", path) from None
        raise
    try:
        st = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, f"is not a regular file ({stat.filemode(st.st_mode)})", path)
    return fd, st


def read_regular(path: str, *, follow: bool = True) -> bytes:
    """The whole content of the regular file at ``path`` (open_regular's rule: a FIFO is refused,
    never waited on); ``follow`` as there, True by default: a path a user or a tool gave."""
    fd, st = open_regular(path, follow=follow)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, max(st.st_size - size, 1 << 20)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def holds_sha256_prefix(path: str, prefix: str) -> bool:
    """Whether the regular file at ``path`` (not followed if a link, never waited on if a FIFO)
    holds bytes whose SHA-256 hex digest begins with ``prefix``; False where it cannot be read."""
    try:
        fd, _ = open_regular(path)
    except OSError:
        return False
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    except OSError:
        return False
    finally:
        os.close(fd)
    return bool(prefix) and digest.hexdigest().startswith(prefix)
