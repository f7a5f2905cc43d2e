"""Entries this process verified, served again from memory while their file is unchanged.

A hit reads the entry's file and checks its CRC (read.py): an open, a read and a close, most of a
warm hit's cost. Once this process has verified a pair, its payload is kept here with the entry
file's identity, and a later read of that path is one lstat: where the file is still that very
file, the bytes verified then are the bytes on disk now, and they are served from memory.

What "that very file" means, and why it is enough:
- its device, inode, size, mtime and ctime. A writer never changes an entry in place: it
  os.replace()s a new file (another inode). Any write to the file in place changes its mtime
  and ctime, and putting the mtime back (os.utime) changes the ctime again: a file damaged or
  rewritten in place never matches, and is read and checked in full (and removed if damaged).
- a file removed (eviction, ``kernelcache clear`` or ``rm`` in another process) fails the lstat:
  a miss, as a read would be. A symlink or FIFO planted there has another inode.
- the bytes served are the ones this process verified, never re-read: damage to the file after
  that reaches no caller of this process (the next process's read checks the file itself).
Uses are still stamped (lru.py) as often as the full read does: once the remembered stamp is due,
``get`` returns None and the read path stamps it and remembers the pair again.

Bounded by bytes (MAX_BYTES; an entry larger than MAX_ENTRY_BYTES is not kept): emptied whole
when full, like every memo of kernelcache (memo.py): forgetting costs reads, never a wrong answer.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

from kernelcache.stores.base import Meta
from kernelcache.stores.file import lru

MAX_BYTES = 32 * 2**20  # what one store keeps in memory at most
MAX_ENTRY_BYTES = 4 * 2**20  # larger entries are read each time (their read is not what costs)

Identity = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Kept(NamedTuple):
    identity: Identity
    payload: bytes
    meta: Meta
    stamped_ns: int  # when this entry's use was last stamped (its sidecar's mtime then)


class Payloads:
    """Verified payloads of one store, by entry path."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        self._bytes = 0
        self._lock = threading.Lock()  # put/forget/clear; get reads the dict alone (one atomic get)

    def after_fork_in_child(self) -> None:
        """A fresh lock (the parent's may have been held by a thread the child does not have)."""
        self._lock = threading.Lock()

    def get(self, path: str, stamping: bool) -> tuple[bytes, Meta] | None:
        """(payload, meta) of the entry at ``path`` if it is still the file verified, and (when
        ``stamping``) its use needs no stamp yet; else None (the caller reads it)."""
        kept = self._kept.get(path)
        if kept is None:
            return None
        try:
            st = os.lstat(path)
        except OSError:
            self.forget(path)
            return None
        if identity(st) != kept.identity:
            self.forget(path)
            return None
        # Race: a writer may os.replace the entry right after this lstat. What is served is then
        # the version this lstat saw, as a read that opened the file a moment earlier would
        # serve it: a compile of this very key (a key's entry is only ever replaced by another
        # compile of that key). The next get sees the new inode and reads it.
        if stamping and lru.due(kept.stamped_ns, time.time_ns()):
            return None  # read in full once: stamped there, and kept again
        return kept.payload, kept.meta

    def put(self, path: str, st: os.stat_result, payload: bytes, meta: Meta, stamped_ns: int) -> None:
        """Keep the pair just verified at ``path`` (``st``: its entry file's fstat)."""
        if len(payload) > MAX_ENTRY_BYTES:
            return
        with self._lock:
            old = self._kept.pop(path, None)
            self._bytes -= len(old.payload) if old is not None else 0
            if self._bytes + len(payload) > MAX_BYTES:
                self._kept.clear()
                self._bytes = 0
            self._kept[path] = _Kept(identity(st), payload, meta, stamped_ns)
            self._bytes += len(payload)

    def forget(self, path: str) -> None:
        with self._lock:
            old = self._kept.pop(path, None)
            if old is not None:
                self._bytes -= len(old.payload)

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0
