"""A process of its own mount namespace that sees another file at a path (root only): what a worker on
another host with other headers at the same paths sees. Used as a ProcessPoolExecutor initializer."""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def can_unshare() -> bool:
    """Whether this process may make mount namespaces (root with CAP_SYS_ADMIN), probed in a child."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNS) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def see_file_as(path: str, other: str) -> None:
    """From now on this process (alone) reads ``other``'s content at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing of ours reaches the host
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(os.fsencode(other), os.fsencode(path), None, MS_BIND, None) != 0:
        raise OSError(ctypes.get_errno(), f"mount --bind {other} {path}")
