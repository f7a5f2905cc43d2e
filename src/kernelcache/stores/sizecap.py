"""Size tracking and eviction for a file store: a shared byte count, LRU by atime, one evictor.

The tracked size lives in the store's persistent counters (stats.FileStats), shared by every
process using the directory: each write moves it by its net delta (O(1), no directory walk),
each removal by the bytes it freed. Eviction brings it down to a low-water mark, least
recently *read* entries first (the file store sets atime on every read).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from kernelcache.log import logger
from kernelcache.stats import FileStats
from kernelcache.stores.fileops import StatKey, pair_lock, path_in, scan_shards, stat_key, try_lock_file, unlink_if_same
from kernelcache.stores.sidecar import META_SUFFIX

# Evict down to this fraction of the cap, not just below it: each eviction pass then frees
# room for many writes, so a full cache pays for a directory scan once per ~10% of its size
# written instead of once per write (cuda.core's rescan-per-write costs O(entries)).
_LOW_WATER = 0.9
# The size tracker drifts when processes race on one key or die mid-way; rescan the
# directory to reset it when the last reconcile is older than this.
_RECONCILE_EVERY_S = 3600


class SizeCap:
    """The tracked size of one store's ``entries`` directory, and eviction under ``max_size``.

    ``max_size`` None: no cap (the size is still tracked). ``locks``: the directory of the
    eviction lock. No reference back to the store: a store is freed (and flushes its
    counters) as soon as its last user drops it.
    """

    def __init__(self, max_size: int | None, stats: FileStats, entries: str, locks: str) -> None:
        self.max_size = max_size
        self._stats = stats
        self._entries = entries
        self._locks = locks
        self._evict_lock = threading.Lock()
        # Oldest-first eviction candidates from the last directory scan: (atime_ns, path,
        # stat key, bytes). Entries written after the scan are newer than all of these,
        # so popping from the left stays LRU order without rescanning per write.
        self._candidates: deque[tuple[int, str, StatKey, int]] = deque()
        if max_size is not None and time.time() - stats.snapshot()["reconciled_at"] > _RECONCILE_EVERY_S:
            self.reconcile()

    def too_large(self, nbytes: int) -> bool:
        """Whether one entry of nbytes could never fit (storing it would evict all and still exceed)."""
        return self.max_size is not None and nbytes > self.max_size

    def wrote(self, delta: int) -> None:
        """A write changed the directory by delta bytes: track it, evict if now over the cap.

        OSError: eviction failed (the write itself stands).
        """
        # The caller measured the pair it replaced under the pair lock, so a racing writer of
        # the same key cannot make this delta stale; writers killed mid-way can (their staged
        # files), and the periodic reconcile absorbs that.
        after = self._stats.add(size_bytes=delta)
        if self.max_size is not None and after["size_bytes"] > self.max_size:
            self.evict()

    def freed(self, nbytes: int, *, evicted: bool = False) -> None:
        """A removal freed nbytes (no-op for 0); ``evicted`` counts it as one eviction."""
        if nbytes:
            self._stats.add(size_bytes=-nbytes, evictions=1 if evicted else 0)

    def emptied(self) -> None:
        """Every entry was removed (clear)."""
        self._candidates.clear()
        self._stats.set("size_bytes", 0)

    def evict(self) -> None:
        """Bring the tracked size down to the low-water mark, least recently read first.

        OSError: an entry could not be removed (the pass still removed the others).
        """
        # One evictor per process (thread lock) and one per directory (a file lock taken
        # without waiting): if another process is already evicting, our write is done and
        # that process frees the room.
        if not self._evict_lock.acquire(blocking=False):
            return
        try:
            fd = try_lock_file(path_in(self._locks, "evict.lock"))
            if fd is None:
                return
            try:
                self._evict_locked()
            finally:
                os.close(fd)  # releases the flock
        finally:
            self._evict_lock.release()

    def _evict_locked(self) -> None:
        assert self.max_size is not None
        target = int(self.max_size * _LOW_WATER)
        size = self._stats.snapshot()["size_bytes"]
        evicted = 0
        rescanned = False
        failed: OSError | None = None
        try:
            while size > target:
                if not self._candidates:
                    if rescanned:
                        break  # everything left is newer than the scan, or is being rewritten
                    size = self.reconcile()
                    rescanned = True
                    continue
                atime_ns, path, key, nbytes = self._candidates.popleft()
                try:
                    freed = self._evict_one(path, key, atime_ns)
                except OSError as exc:
                    failed = failed or exc  # keep evicting others; report it after the pass
                    continue
                if freed:
                    size -= freed
                    evicted += 1
                    self._stats.add(size_bytes=-freed)
        finally:
            if evicted:
                self._stats.add(evictions=evicted)
                logger.info(
                    "evicted %d least recently used entries from %s: %d bytes left, cap %d",
                    evicted,
                    os.path.dirname(os.path.dirname(self._entries)),
                    size,
                    self.max_size,
                )
        if failed is not None:
            raise failed

    @staticmethod
    def _evict_one(path: str, key: StatKey, atime_ns: int) -> int:
        """Remove this candidate if it is still the version the scan saw, unread since; bytes freed."""
        # Under the pair lock: a writer of this key publishes its sidecar and entry as one
        # step, so we never remove a fresh sidecar that belongs to an entry being published.
        with pair_lock(os.path.dirname(path)):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                return 0
            # Stat guard: evict only the exact file version that the scan saw, unread since.
            # A different inode/size/mtime means a writer replaced it; a newer atime means a
            # reader used it: either way it is no longer a least-recently-used entry.
            if stat_key(st) != key or st.st_atime_ns != atime_ns:
                return 0
            freed = unlink_if_same(path, key)
            if freed is None:
                return 0
            return freed + (unlink_if_same(path + META_SUFFIX, None) or 0)

    def reconcile(self) -> int:
        """Rescan entries/: reset the size tracker and refill the eviction candidates."""
        total = 0
        found = []
        meta_sizes: dict[str, int] = {}
        for f, st in scan_shards(self._entries):
            total += st.st_size
            if f.name.endswith(META_SUFFIX):
                meta_sizes[f.path[: -len(META_SUFFIX)]] = st.st_size
            else:
                found.append((st.st_atime_ns, f.path, stat_key(st), st.st_size))
        found.sort()
        self._candidates = deque((a, p, k, n + meta_sizes.get(p, 0)) for a, p, k, n in found)
        self._stats.set("size_bytes", total)
        self._stats.set("reconciled_at", int(time.time()))
        return total
