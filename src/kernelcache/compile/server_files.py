"""The files of a compile server (server.py) in its directory: ``<fingerprint>.sock``, the
socket it listens on, and ``<fingerprint>.lock``, whose flock, held for the server's life, makes
it the only one for that socket. A server that exits removes both; one that was killed (a PID
namespace's end takes its processes with it) leaves them, and the next server to start there
removes them (clear_dead)."""

from __future__ import annotations

import fcntl
import os
import socket
import time

__all__ = ["LOCK_WAIT_S", "clear_dead", "exclusive", "let_go", "listen", "unlink_if_ours"]

LOCK_WAIT_S = 2.0  # a server that is exiting still holds the lock for a moment


def listen(path: str) -> socket.socket:
    """The listening socket at ``path``, for the holder of its lock."""
    try:
        os.unlink(path)  # a dead server's: we hold the lock, so no live server listens there
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock


def unlink_if_ours(path: str, inode: int) -> None:
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except OSError:
        pass


def exclusive(path: str) -> int | None:
    """The lock fd that makes this the only server for ``path``, or None when another holds it.

    Race: a lock file is removed by the one holding it (a server as it exits: let_go; a
    server clearing a dead one's: clear_dead), so that none is left per environment. A server
    started meanwhile may have opened that file before it went, and gets the lock on it once it
    is let go: a lock on a removed file, while the next one locks a new file at the path, and
    both would serve. So a lock counts only on the very file the path names now; on any other,
    it is opened anew."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _names(path, fd):
                return fd
        except BlockingIOError:
            pass
        os.close(fd)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def let_go(path: str, fd: int) -> None:
    """Remove the lock file at ``path``, still locked at ``fd`` (exclusive says why that is
    safe), then release it."""
    try:
        if _names(path, fd):  # not another's, were it removed and made anew meanwhile
            os.unlink(path)
    except OSError:
        pass
    os.close(fd)


def clear_dead(directory: str, mine: str) -> None:
    """Remove the socket and lock files of the servers in ``directory`` that ended without
    removing them (killed): a lock file nobody holds. Another server's lock, held, is left."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith(".lock") and n != mine]
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone already, or not a file of ours to open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: that server is alive (or starting)
            os.close(fd)
            continue
        if _names(path, fd):
            try:
                os.unlink(path[: -len(".lock")] + ".sock")
            except OSError:
                pass
        let_go(path, fd)


def _names(path: str, fd: int) -> bool:
    """``path`` is the file open at ``fd``."""
    try:
        st, at = os.stat(path, follow_symlinks=False), os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (at.st_dev, at.st_ino)
