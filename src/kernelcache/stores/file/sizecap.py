"""Size tracking and eviction for a file store: a shared byte count, LRU (lru.py), one evictor.

The tracked size lives in the store's persistent counters (stores.file.counters), shared by every
process using the directory. A writer *reserves* its bytes before it stages them (so bytes
in flight count), and settles after publishing (minus what it replaced); each removal
subtracts the bytes it freed. O(1) per write, no directory walk. Eviction brings it down to
a low-water mark, least recently *used* first (the stamp every reader sets: lru.py), entries
and the copies handed to Triton alike (one budget: a copy's bytes are counted when it is
written, count_copy), and sweeps the staged files of dead writers (ops.sweep_dead_temps).

The invariant: the tracked size, in-flight bytes included, exceeds the cap by
at most one value per writer. A writer whose reservation puts the store over the cap waits
for the one evictor (instead of returning and leaving the store further over) and stages
only once the room is made.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from kernelcache import forksafe
from kernelcache.log import logger
from kernelcache.stores.file import locks as lockfiles
from kernelcache.stores.file import lru
from kernelcache.stores.file.counters import FileStats
from kernelcache.stores.file.ops import pair_lock, path_in, stat_key, sweep_dead_temps, unlink_if_same
from kernelcache.stores.file.sidecar import META_SUFFIX

# Evict down to this fraction of the cap, not just below it: each eviction pass then frees
# room for many writes, so a full cache pays for a directory scan once per ~10% of its size
# written instead of once per write (cuda.core's rescan-per-write costs O(entries)).
_LOW_WATER = 0.9
# The size tracker drifts when processes race on one key or die mid-way, and files that
# no writer reserved (another program's leftovers in tmp/) are only seen by a scan. An
# eviction pass reconciles (a full rescan that corrects the tracker both ways) when the
# last reconcile is older than this, or this process evicted this many entries since its
# last one; a store opened with a cap reconciles when the last one is older than this.
_RECONCILE_EVERY_S = 600
_RECONCILE_EVERY_EVICTIONS = 512
# How long a writer over the cap waits for the running evictor before it goes on without
# the room; after such a wait this process stops waiting for a while (a stopped evictor
# process must not cost every write of every process the whole wait).
_EVICT_WAIT_S = 10.0
_STUCK_BACKOFF_S = 60.0


class SizeCap:
    """The tracked size of one store's ``entries`` directory, and eviction under ``max_size``.

    ``max_size`` None: no cap (the size is still tracked). ``locks``: the directory of the
    eviction lock. No reference back to the store: a store is freed (and flushes its
    counters) as soon as its last user drops it.
    """

    def __init__(
        self, max_size: int | None, stats: FileStats, entries: str, locks: str, tmp: str, tmp_max_age_s: float
    ) -> None:
        self.max_size = max_size
        self._stats = stats
        self._entries = entries
        self._locks = locks
        self._tmp = tmp
        self._tmp_max_age_s = tmp_max_age_s
        self._evict_lock = threading.Lock()
        forksafe.reset_in_child(self)
        self._stuck_until = 0.0  # until then, do not wait for an evictor that seems stuck
        self._root = os.path.dirname(os.path.dirname(entries))  # <root>/v2/entries: copies are under <root>
        # Oldest-first eviction candidates from the last directory scan (lru.scan). Entries
        # written after the scan are newer than all of these, so popping from the left
        # stays LRU order without rescanning per write.
        self._candidates: deque[lru.Candidate] = deque()
        self._evicted_since_reconcile = 0
        if max_size is not None and time.time() - stats.snapshot()["reconciled_at"] > _RECONCILE_EVERY_S:
            self.reconcile()

    def after_fork_in_child(self) -> None:
        """A fresh evict lock (the parent's evictor is not in the child)."""
        self._evict_lock = threading.Lock()

    def too_large(self, nbytes: int) -> bool:
        """Whether one entry of nbytes could never fit (storing it would evict all and still exceed)."""
        return self.max_size is not None and nbytes > self.max_size

    def reserve(self, nbytes: int) -> None:
        """A writer is about to stage nbytes: make room first if they do not fit, then count
        them (the staged files take room too).

        OSError: eviction failed (the write goes on; the store stays over its cap).
        """
        if self.max_size is not None and self._stats.snapshot()["size_bytes"] + nbytes > self.max_size:
            # Race: 8 writers find the store full at once. Before, each tried the evict
            # lock without waiting and all but one returned: the writers outran the one
            # evictor and the store ran at several times its cap. Now each waits for the
            # lock, then evicts only if its bytes still do not fit (the first evictor
            # usually made room for all: it goes down to the low-water mark). Writers reserve
            # after the wait, so a scan during eviction never misses a reservation whose
            # files are not staged yet (see _evict_locked).
            try:
                self.evict(wait=True, room=nbytes)
            finally:
                # Counted even when eviction failed: the write goes on and settles
                # (-replaced or -nbytes) as if it had reserved, so the tracker never
                # falls below what is on disk.
                self._stats.add(size_bytes=nbytes)
            return
        # Race: writers that all found room at once all add: the tracked size then exceeds
        # the cap by at most one value per writer (the invariant), and the next eviction
        # takes it back down.
        self._stats.add(size_bytes=nbytes)

    def settle(self, delta: int) -> None:
        """After the write: -replaced bytes when it published, -nbytes when it failed."""
        if delta:
            self._stats.add(size_bytes=delta)

    def count_copy(self, nbytes: int) -> None:
        """A copy of an entry with bytes of its own (not a hard link) is about to be written
        under the root: it counts under the one cap like an entry (room made first, reserve)."""
        self.reserve(nbytes)

    def freed(self, nbytes: int, *, evicted: bool = False) -> None:
        """A removal freed nbytes (no-op for 0); ``evicted`` counts it as one eviction."""
        if nbytes:
            self._stats.add(size_bytes=-nbytes, evictions=1 if evicted else 0)

    def emptied(self, freed: int) -> None:
        """A clear removed every entry it listed, freeing ``freed`` bytes: what writers
        published or reserved meanwhile stays counted."""
        self._candidates.clear()
        self.freed(freed)

    def evict(self, *, wait: bool = False, room: int = 0) -> None:
        """Bring the tracked size down to the low-water mark, least recently read first.

        One evictor per process (thread lock) and one per directory (the evict lock file).
        ``wait``: wait for a running evictor, then evict if ``room`` more bytes still do not
        fit; otherwise return at once when another evictor runs. OSError: an entry could not
        be removed (the pass still removed the others).
        """
        wait = wait and time.monotonic() >= self._stuck_until
        timeout = _EVICT_WAIT_S if wait else 0.0
        got = self._evict_lock.acquire(timeout=timeout) if wait else self._evict_lock.acquire(blocking=False)
        if not got:
            return
        try:
            fd = lockfiles.acquire(path_in(self._locks, "evict.lock"), timeout, mode=lockfiles.mode_for(self._locks))
            if fd is None:
                if wait:
                    self._stuck_until = time.monotonic() + _STUCK_BACKOFF_S
                return
            try:
                self._evict_locked(room)
            finally:
                lockfiles.release(fd)
        finally:
            self._evict_lock.release()

    def _evict_locked(self, room: int) -> None:
        assert self.max_size is not None
        target = min(int(self.max_size * _LOW_WATER), self.max_size - room)
        size = self._stats.snapshot()["size_bytes"]
        if size + room <= self.max_size:
            return  # the evictor we waited for made the room
        swept = sum(n for _, n in sweep_dead_temps(self._tmp, self._tmp_max_age_s))
        if swept:
            # Staged files of killed writers: counted since their reservation, freed now.
            size = self._stats.add(size_bytes=-swept)["size_bytes"]
        rescanned = False
        if self._reconcile_due():
            # Under the evict lock: no other evictor moves the tracker meanwhile, so the
            # correction may go up too (bounded by the writes in flight during the scan).
            size = self.reconcile()
            rescanned = True
        evicted = 0
        try:
            while True:
                size, taken = lru.take(self._candidates, size, target, self._remove)
                evicted += taken
                if size <= target or rescanned:
                    break  # what is left is newer than the scan, being rewritten, or just handed out
                size = self._rescan()
                rescanned = True
        finally:
            self._evicted_since_reconcile += evicted
            if evicted:
                self._stats.add(evictions=evicted)
                logger.info(
                    "evicted %d least recently used entries and copies from %s: %d bytes left, cap %d",
                    evicted,
                    self._root,
                    size,
                    self.max_size,
                )

    def _remove(self, c: lru.Candidate) -> int | None:
        """Take one candidate (_evict_one, lru.remove_copy); counts what it freed. None: kept."""
        got = lru.remove_copy(c) if c.copy else self._evict_one(c)
        if got is not None:
            self._stats.add(size_bytes=-got)
        return got

    @staticmethod
    def _evict_one(c: lru.Candidate) -> int | None:
        """Remove this entry if it is still the version the scan saw, unused since; bytes freed."""
        # Under the pair lock: a writer of this key publishes its sidecar and entry as one
        # step, so we never remove a fresh sidecar that belongs to an entry being published.
        with pair_lock(os.path.dirname(c.path)):
            try:
                st = os.lstat(c.path)
            except FileNotFoundError:
                return None
            try:
                side: os.stat_result | None = os.lstat(c.path + META_SUFFIX)
            except FileNotFoundError:
                side = None
            # Stat guard: evict only the exact file version that the scan saw, unused since.
            # A different inode/size/mtime means a writer replaced it; a newer stamp means a
            # reader used it: either way it is no longer a least-recently-used entry.
            if stat_key(st) != c.key or lru.last_used_ns(st, side) != c.last_used_ns:
                return None
            got = unlink_if_same(c.path, c.key)
            if got is None:
                return None
            return got + (unlink_if_same(c.path + META_SUFFIX, None) or 0)

    def _rescan(self) -> int:
        """Refill the candidates; correct the tracker only downward (returns it).

        Race: writers reserve and stage while we scan. One that reserved after our snapshot
        and staged before the scan of tmp/ is counted twice by the scan's total, so the scan
        can prove an over-count (the tracker is above everything on disk, e.g. after killed
        writers' reservations) but not an under-count: raising the tracker here made it run
        away under 8 writers. Upward drift waits for the periodic reconcile. A reservation
        is counted by the scan from its staged files' creation (they get their full size
        at once), so the only bytes a downward correction can miss are those of writers
        between reserving and creating a file: microseconds, one value at most each.
        """
        before = self._stats.snapshot()["size_bytes"]
        total = self._scan()
        if total < before:
            return self._stats.add(size_bytes=total - before)["size_bytes"]
        return before

    def _reconcile_due(self) -> bool:
        if self._evicted_since_reconcile >= _RECONCILE_EVERY_EVICTIONS:
            return True
        return time.time() - self._stats.snapshot()["reconciled_at"] > _RECONCILE_EVERY_S

    def reconcile(self) -> int:
        """Rescan entries/ and tmp/: correct the size tracker and refill the eviction candidates.

        Every file counts, whoever wrote it: a leftover of another program in tmp/ takes
        room like an entry (it goes when it is old enough to be swept).
        """
        self._evicted_since_reconcile = 0
        before = self._stats.snapshot()["size_bytes"]
        total = self._scan()
        # A correction, not a set: what other writers reserve during the scan is kept. (One
        # whose staged file the scan also saw is then counted twice until the next
        # reconcile: an over-count, on the side of the cap.)
        after = self._stats.add(size_bytes=total - before)["size_bytes"]
        self._stats.set("reconciled_at", int(time.time()))
        return after

    def _scan(self) -> int:
        """Refill the candidates (entries and copies, lru.scan); return the bytes that count."""
        self._candidates, total = lru.scan(self._entries, self._tmp, self._root)
        return total
