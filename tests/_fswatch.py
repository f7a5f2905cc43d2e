"""Real filesystem events for tests (Linux inotify through libc): act at the exact moment
another thread or process opens, reads or writes a file, without touching the code under test."""

from __future__ import annotations

import ctypes
import os
import select
import struct

IN_CLOSE_WRITE = 0x08
IN_CLOSE_NOWRITE = 0x10
IN_CREATE = 0x100
IN_MOVED_TO = 0x80

_libc = ctypes.CDLL(None, use_errno=True)


class Watch:
    """An inotify instance; ``add(path, mask)`` then ``events(timeout)`` -> [(dir, mask, name)]."""

    def __init__(self) -> None:
        self.fd = _libc.inotify_init1(os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, str] = {}

    def add(self, path: str, mask: int) -> None:
        wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self._dirs[wd] = path

    def events(self, timeout: float) -> list[tuple[str, int, str]]:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        data = os.read(self.fd, 65536)
        out = []
        pos = 0
        while pos < len(data):
            wd, mask, _cookie, size = struct.unpack_from("iIII", data, pos)
            name = data[pos + 16 : pos + 16 + size].rstrip(b"\0").decode()
            out.append((self._dirs.get(wd, ""), mask, name))
            pos += 16 + size
        return out

    def close(self) -> None:
        os.close(self.fd)


def wait_for_read(path: str, timeout: float) -> bool:
    """Block until some process closes ``path`` after reading it (True) or timeout (False)."""
    w = Watch()
    try:
        w.add(path, IN_CLOSE_NOWRITE)
        return bool(w.events(timeout))
    finally:
        w.close()
