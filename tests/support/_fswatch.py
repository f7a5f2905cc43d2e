"""Real filesystem events for tests (Linux inotify through libc): act at the exact moment
another thread or process opens, reads or writes a file, without touching the code under test."""

from __future__ import annotations

import ctypes
import os
import select
import struct
from collections.abc import Callable

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


# fanotify permission events (root only): the opener is held inside open() until the
# listener answers, so the listener acts before the opener sees the file (no race).
FAN_CLOEXEC = 0x1
FAN_CLASS_CONTENT = 0x4
FAN_MARK_ADD = 0x1
FAN_OPEN_PERM = 0x10000
FAN_EVENT_ON_CHILD = 0x08000000
FAN_ALLOW = 0x1
_AT_FDCWD = -100
_META = struct.Struct("IBBHQii")  # struct fanotify_event_metadata
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]


class OpenGate:
    """Every open of a file directly in the added directories waits in the kernel until
    ``serve``'s handler has returned; the handler gets (path, fd): an fd of the opened file
    (read-write, and using it raises no event) and the path it has. Needs CAP_SYS_ADMIN."""

    def __init__(self) -> None:
        self.fd = _libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC, os.O_RDWR | os.O_LARGEFILE | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")

    def add(self, directory: str) -> None:
        mask = FAN_OPEN_PERM | FAN_EVENT_ON_CHILD  # files in it, not the directory itself
        if _libc.fanotify_mark(self.fd, FAN_MARK_ADD, mask, _AT_FDCWD, os.fsencode(directory)) < 0:
            raise OSError(ctypes.get_errno(), f"fanotify_mark {directory}")

    def serve(self, handler: Callable[[str, int], None]) -> None:
        """Answer opens forever; each is allowed once ``handler(path, fd)`` returned."""
        while True:
            data = os.read(self.fd, 65536)
            pos = 0
            while pos < len(data):
                event_len, _vers, _res, _mlen, _mask, fd, _pid = _META.unpack_from(data, pos)
                pos += event_len
                if fd < 0:
                    continue
                try:
                    handler(os.readlink(f"/proc/self/fd/{fd}"), fd)
                finally:
                    os.write(self.fd, struct.pack("iI", fd, FAN_ALLOW))
                    os.close(fd)

    def close(self) -> None:
        os.close(self.fd)
