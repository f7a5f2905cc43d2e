"""InMemoryProgramCache: a thread-safe LRU of artifacts in process memory, capped in bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Any

from kernelcache.stores.base import Meta, RecordStore, as_key_bytes, check_max_size


class InMemoryProgramCache(RecordStore):
    """LRU by access (reads and writes both refresh an entry), thread-safe.

    ``max_size_bytes`` caps the sum of payload sizes (None: no cap; <= 0: ValueError).
    An entry larger than the cap is not stored at all (storing it would evict everything
    and still not fit). Values are immutable ``bytes``, so a hit returns the stored object
    itself without a copy.
    """

    def __init__(self, max_size_bytes: int | None = None) -> None:
        super().__init__()
        self._max_size = check_max_size(max_size_bytes)
        self._lock = threading.Lock()
        self._entries: OrderedDict[bytes, tuple[bytes, Meta]] = OrderedDict()
        self._size = 0
        # Hits of the lock-free read path: (key, payload size), appended without the lock
        # (deque.append is thread-safe in CPython, with or without the GIL). They are
        # applied -- LRU bumps and counters -- under the lock before any eviction, at
        # stats(), and whenever 256 have piled up, so the LRU order eviction sees is exact.
        self._pending_hits: deque[tuple[bytes, int]] = deque()
        self._misses = 0  # counted under the lock (a miss is followed by a compile anyway)

    def after_fork_in_child(self) -> None:
        super().after_fork_in_child()
        self._lock = threading.Lock()

    @property
    def max_size_bytes(self) -> int | None:
        return self._max_size

    def __getitem__(self, key: bytes | str) -> bytes:
        # The hot path takes no lock: one dict.get (atomic) and one deque.append.
        k = key if type(key) is bytes else as_key_bytes(key)
        record = self._entries.get(k)
        if record is None:
            with self._lock:
                self._misses += 1
            raise KeyError(key)
        pending = self._pending_hits
        pending.append((k, len(record[0])))
        if len(pending) >= 256:
            with self._lock:
                self._apply_pending_hits()
        return record[0]

    def _apply_pending_hits(self) -> None:
        """Apply queued hits: bump each key still present, count hits and bytes (lock held)."""
        entries, pending = self._entries, self._pending_hits
        hits = nbytes = 0
        while pending:
            k, n = pending.popleft()
            hits += 1
            nbytes += n
            if k in entries:
                entries.move_to_end(k)
        if hits:
            self._stats.add_deferred(hits=hits, bytes_read=nbytes)

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        try:
            return self[key]
        except KeyError:
            return default

    @property
    def reads_renew(self) -> bool:
        return True  # LRU by access

    def _read(self, key: bytes) -> tuple[bytes, Meta] | None:
        with self._lock:
            self._apply_pending_hits()
            record = self._entries.get(key)
            if record is not None:
                self._entries.move_to_end(key)
            return record

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        if self._max_size is not None and len(payload) > self._max_size:
            self.warn_once(
                "too-large",
                f"an entry of {len(payload)} bytes exceeds max_size_bytes={self._max_size}; not stored in memory",
                counted_as="too_large",
            )
            return False
        evicted = 0
        with self._lock:
            self._apply_pending_hits()  # eviction must see every read that happened before it
            old = self._entries.pop(key, None)
            if old is not None:
                self._size -= len(old[0])
            self._entries[key] = (payload, meta)
            self._size += len(payload)
            if self._max_size is not None:
                while self._size > self._max_size:
                    _, (victim, _) = self._entries.popitem(last=False)
                    self._size -= len(victim)
                    evicted += 1
        if evicted:
            self._stats.add(evictions=evicted)
        return True

    def _remove(self, key: bytes) -> bool:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is None:
                return False
            self._size -= len(old[0])
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0

    def zero_stats(self) -> None:
        with self._lock:
            self._apply_pending_hits()  # their LRU bumps stay; their counts go with the rest
            self._misses = 0
        super().zero_stats()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._apply_pending_hits()
            misses, self._misses = self._misses, 0
        self._stats.add_deferred(misses=misses)
        out = super().stats()
        with self._lock:
            out["size_bytes"] = self._size
            out["entries"] = len(self._entries)
        out["max_size_bytes"] = self._max_size or 0
        return out
