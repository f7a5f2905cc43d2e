"""Entries this process verified, served again from memory while their file is unchanged.

A hit reads the entry's file and checks its CRC (read.py): an open, a read and a close, most of a
warm hit's cost. Once this process has verified a pair, its payload is kept here with the entry
file's identity, and a later read of that path is one lstat: where the file is still that very
file, the bytes verified then are the bytes on disk now, and they are served from memory.

What "that very file" means, and why it is enough:
- its device, inode, size, mtime and ctime. A writer never changes an entry in place: it
  os.replace()s a new file. Any write to the file in place changes its mtime and ctime, and
  putting the mtime back (os.utime) changes the ctime again.
- but a new file may get the inode of one just freed, and timestamps are only as fine as the
  file system keeps them (whole seconds on ext3, ext4 with 128-byte inodes, HFS+ or some NFS
  servers; one kernel tick, 1-10 ms, on kernels with coarse timestamps): two rewrites of one key
  within that tick can leave a file that matches the first one's identity with other bytes
  (an adversarial pass found it: the first value served 1992 times in 2000). Hence the racy
  rule (kernelcache.timestamps, as the header digests use it): a pair is kept only where its
  entry had not changed since a moment taken before this process began to read it, so that any
  later file at that inode, written after that read, has later timestamps.
- a pair is trusted for TRUST_S after it was read in full, then read in full again: where the
  file system's attributes lag (an NFS client's attribute cache; a server whose clock is behind
  this host's, which the racy rule cannot see), a replaced entry is seen within TRUST_S.
- a file removed (eviction, ``kernelcache clear`` or ``rm`` in another process) fails the lstat:
  a miss, as a read would be. A symlink or FIFO planted there has another inode. This store's
  own writes forget the pair they replace.
- the bytes served are the ones this process verified, never re-read: damage to the file after
  that reaches no caller of this process (the next read in full checks the file itself).
Uses are still stamped (lru.py) as often as the full read does: once the remembered stamp is due,
``get`` returns None and the read path stamps it and remembers the pair again.

Bounded by bytes, the metadata counted too (MAX_BYTES; an entry larger than MAX_ENTRY_BYTES is not
kept) and by entries (MAX_ENTRIES): emptied whole when full, like every memo of kernelcache
(memo.py): forgetting costs reads, never a wrong answer.
"""

from __future__ import annotations

import os
import threading
import time

from kernelcache.stores.base import Meta
from kernelcache.stores.file import lru
from kernelcache.timestamps import changed_since

MAX_BYTES = 32 * 2**20  # what one store keeps in memory at most (payloads, sidecars' size, overhead)
MAX_ENTRY_BYTES = 4 * 2**20  # larger entries are read each time (their read is not what costs)
MAX_ENTRIES = 4096
_OVERHEAD_BYTES = 512  # what one kept pair costs beyond its payload and sidecar (objects, dict slot)
TRUST_S = 1.0  # a kept pair is read in full again this long after its last read in full

Identity = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _Kept:
    """One kept pair. (A class with slots: a NamedTuple costs the store's import 0.1-0.2 ms to make.)"""

    __slots__ = ("cost", "identity", "meta", "payload", "read_at", "stamped_ns")

    def __init__(
        self, identity: Identity, payload: bytes, meta: Meta, stamped_ns: int, read_at: float, cost: int
    ) -> None:
        self.identity = identity
        self.payload = payload
        self.meta = meta
        self.stamped_ns = stamped_ns  # when this entry's use was last stamped (its sidecar's mtime then)
        self.read_at = read_at  # time.monotonic() of the read in full that verified it
        self.cost = cost  # what it counts against MAX_BYTES


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
        # serve it (another compile of this key, or through the mapping API the value stored
        # before). The next get sees the new inode and reads it.
        if time.monotonic() - kept.read_at > TRUST_S or (stamping and lru.due(kept.stamped_ns, time.time_ns())):
            return None  # read in full once (stamped there), and kept again
        return kept.payload, kept.meta

    def put(
        self,
        path: str,
        st: os.stat_result,
        read_ns: int,
        payload: bytes,
        meta: Meta,
        stamped_ns: int,
        sidecar_size: int,
    ) -> None:
        """Keep the pair just verified at ``path`` (``st``: its entry file's fstat; ``read_ns``: a
        timestamps.now_ns() taken before that read), where the file had not changed since then
        (the racy rule, in the module docstring)."""
        if len(payload) > MAX_ENTRY_BYTES or changed_since(st, read_ns):
            return
        cost = len(payload) + sidecar_size + _OVERHEAD_BYTES
        with self._lock:
            old = self._kept.pop(path, None)
            self._bytes -= old.cost if old is not None else 0
            if self._bytes + cost > MAX_BYTES or len(self._kept) >= MAX_ENTRIES:
                self._kept.clear()
                self._bytes = 0
            self._kept[path] = _Kept(identity(st), payload, meta, stamped_ns, time.monotonic(), cost)
            self._bytes += cost

    def forget(self, path: str) -> None:
        with self._lock:
            old = self._kept.pop(path, None)
            if old is not None:
                self._bytes -= old.cost

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0
