"""TieredProgramCache: memory -> disk -> Redis -> object store; hits are promoted upward, writes go everywhere."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from kernelcache.stores.base import (
    CountingStore,
    Meta,
    ProgramCacheResource,
    ValueLike,
    as_key_bytes,
    as_value_bytes,
)

# Counters a layer above reports through add_stats, and which tiers they belong to.
_TO_SERVING_TIER = ("hits", "bytes_read", "compile_us_saved")
_TO_EVERY_TIER = ("misses", "compiles")


class Deferred:
    """A tier made on its first use: a far tier (Redis, an object store) that a hit from a nearer
    one never needs, so that such a hit neither imports its client nor connects.

    ``make()`` returns the store; ``read_only`` is what it will say (asked before it exists);
    ``name`` names it in messages ("Redis").
    """

    def __init__(self, make: Callable[[], ProgramCacheResource], *, read_only: bool, name: str) -> None:
        self.make = make
        self.read_only = read_only
        self.name = name


class TieredProgramCache(CountingStore):
    """Reads walk ``tiers`` in order; a hit in a lower tier is copied into every tier above it.

    Writes and promotions go to every tier but the read-only ones (a bundle, a read-only
    Redis): a hit from a bundle is copied into the tiers above it only. Counting follows what the
    user did: ``stats()`` has one hit or miss per look-up and one store per write; in each
    tier (``tier_stats()``) a look-up is a miss in the tiers it passed and a hit in the tier
    that answered, a write is one store, and compile_program's compiles and seconds saved
    land in the tiers where the user looks (every tier's compiles; the savings of a hit in
    the tier that served it). Internal look-ups and writes (header manifests, promotions)
    are never user hits, misses or stores, here or in a tier.
    Single flight uses the first file tier's locks (processes of this host) and the first
    Redis tier's lock (every host sharing the server).
    """

    def __init__(self, tiers: Sequence[ProgramCacheResource | Deferred]) -> None:
        super().__init__()
        tiers = list(tiers)
        if not tiers:
            raise ValueError("TieredProgramCache needs at least one tier, e.g. [InMemoryProgramCache(), ...]")
        for t in tiers:
            if not isinstance(t, (ProgramCacheResource, Deferred)):
                raise TypeError(f"every tier must be a ProgramCacheResource, not {type(t).__name__}")
        self._tiers: list[ProgramCacheResource | Deferred] = tiers
        self._making = threading.Lock()
        # Which tier answered this thread's last uncounted look-up: compile_program looks
        # up uncounted, then reports the hit through add_stats from the same thread.
        # Race: threads share this store, and a plain attribute would let another thread's
        # look-up replace the answer between a look-up and its count; one per thread.
        self._served = threading.local()

    def after_fork_in_child(self) -> None:
        self._making = threading.Lock()

    @property
    def tiers(self) -> list[ProgramCacheResource]:
        """The tiers, nearest first (a deferred one is made now)."""
        return [self._tier(i) for i in range(len(self._tiers))]

    def _tier(self, i: int) -> ProgramCacheResource:
        tier = self._tiers[i]
        if isinstance(tier, Deferred):
            # Race: two threads' first uses of a deferred tier; the lock makes it once.
            with self._making:
                tier = self._tiers[i]
                if isinstance(tier, Deferred):
                    tier = self._tiers[i] = tier.make()
        return tier

    def _made(self) -> list[ProgramCacheResource]:
        """The tiers made so far (closing or zeroing one never made is nothing to do)."""
        return [t for t in self._tiers if not isinstance(t, Deferred)]

    # -- reads -------------------------------------------------------------------------------

    def _walk(self, key: bytes, mode: str) -> tuple[bytes, Meta] | None:
        for i in range(len(self._tiers)):
            tier = self._tier(i)  # a deferred tier is made when a look-up first reaches it
            if mode == "user":
                record = tier.get_record(key)
            elif mode == "uncounted" and isinstance(tier, CountingStore):
                record = tier.get_record_uncounted(key)
            else:
                record = tier.get_record(key, internal=True)
            if record is not None:
                self._promote(key, record, i)
                if mode == "uncounted":
                    self._served.index = i
                return record
        if mode == "uncounted":
            self._served.index = None
        return None

    def _promote(self, key: bytes, record: tuple[bytes, Meta], served: int) -> None:
        """Copy a hit into every tier above the one that served it: the next look-up stops higher up.
        Never downward: a hit is not written into the tiers below it."""
        for upper in (self._tier(i) for i in range(served)):
            if not upper.read_only:  # a bundle above the disk that served it
                upper.set_record(key, record[0], record[1], internal=True)

    def get_many(self, keys: Sequence[bytes | str], *, internal: bool = False) -> list[tuple[bytes, Meta] | None]:
        """Each tier is asked once for the keys still missing (one round trip per remote tier)."""
        wanted = [as_key_bytes(key) for key in keys]
        found: list[tuple[bytes, Meta] | None] = [None] * len(wanted)
        missing = list(range(len(wanted)))
        for i in range(len(self._tiers)):
            if not missing:
                break
            tier = self._tier(i)  # made only where some key is still missing
            for j, record in zip(missing, tier.get_many([wanted[j] for j in missing], internal=internal)):
                if record is not None:
                    found[j] = record
                    self._promote(wanted[j], record, i)
            missing = [j for j in missing if found[j] is None]
        for record in found:
            self._count_read(record, internal)
        return found

    def _counted_read(self, key: bytes, internal: bool) -> tuple[bytes, Meta] | None:
        record = self._walk(key, "internal" if internal else "user")
        self._count_read(record, internal)
        return record

    def get_record_uncounted(self, key: bytes) -> tuple[bytes, Meta] | None:
        return self._walk(key, "uncounted")

    # -- writes ------------------------------------------------------------------------------

    def set_record(
        self, key: bytes | str, payload: ValueLike, meta: Meta | None = None, *, internal: bool = False
    ) -> bool:
        k, data = as_key_bytes(key), as_value_bytes(payload)
        written = False
        for tier in self.tiers:
            if tier.read_only:
                continue  # a bundle refuses writes; a read-only Redis drops them
            written = tier.set_record(k, data, dict(meta or {}), internal=internal) or written
        if written and not internal:
            self._stats.add_deferred(stores=1, bytes_written=len(data))
        return written

    def add_stats(self, **deltas: int) -> None:
        """Count a layer's events here and in the tiers they happened in (see the class doc)."""
        self._stats.add_deferred(**deltas)
        served = getattr(self._served, "index", None)
        for i in range(len(self._tiers)):
            mine = {k: v for k, v in deltas.items() if k in _TO_EVERY_TIER}
            if served is not None and "hits" in deltas:
                if i < served:
                    mine["misses"] = mine.get("misses", 0) + deltas["hits"]
                elif i == served:
                    mine.update({k: v for k, v in deltas.items() if k in _TO_SERVING_TIER})
            if mine:  # a hit above a deferred tier has nothing for it: it stays unmade
                self._tier(i).add_stats(**mine)

    def _remove(self, key: bytes) -> bool:
        removed, failure = False, None
        for tier in self.tiers:
            if tier.read_only:
                continue
            try:
                del tier[key]
                removed = True
            except KeyError:
                pass
            except OSError as exc:  # the other tiers still drop it; the caller learns it stayed
                failure = failure or exc
        if failure is not None:
            raise failure
        return removed

    def __len__(self) -> int:
        return max((len(t) for t in self.tiers), default=0)

    def clear(self) -> None:
        for tier in self.tiers:
            if not tier.read_only:
                tier.clear()

    # Capabilities: a tiered store offers what its tiers do. Single flight uses the first
    # tier with file locks (processes of this host) and the first with a remote lock (every
    # host sharing the server).

    @property
    def read_only(self) -> bool:
        return all(tier.read_only for tier in self._tiers)  # a deferred tier says it unmade

    def lock_path(self, name: str) -> str | None:
        for i in range(len(self._tiers)):  # the nearest file tier answers before a far one is made
            path = self._tier(i).lock_path(name)
            if path is not None:
                return path
        return None

    @property
    def has_remote_lock(self) -> bool:
        return any(tier.has_remote_lock for tier in self.tiers)

    def remote_lock(
        self, name: str, deadline: float, ready: Callable[[], bool], local_lock: str | None = None
    ) -> contextlib.AbstractContextManager[str]:
        for tier in self.tiers:
            if tier.has_remote_lock:
                return tier.remote_lock(name, deadline, ready, local_lock=local_lock)
        return contextlib.nullcontext("unavailable")

    @property
    def tmp_dir(self) -> str | None:
        tiers = (self._tier(i) for i in range(len(self._tiers)))
        return next((tier.tmp_dir for tier in tiers if tier.tmp_dir is not None), None)

    @property
    def file_root(self) -> str | None:
        tiers = (self._tier(i) for i in range(len(self._tiers)))
        return next((tier.file_root for tier in tiers if tier.file_root is not None), None)

    def tier_stats(self) -> list[dict[str, Any]]:
        return [t.stats() for t in self.tiers]

    def zero_stats(self) -> None:
        """Zero this store's counters and every tier's."""
        super().zero_stats()
        for tier in self.tiers:
            tier.zero_stats()

    def close(self) -> None:
        for tier in self._made():
            tier.close()


def leaf_tiers(cache: ProgramCacheResource) -> list[ProgramCacheResource]:
    """The stores that each hold their own copy of a record, nearest first (nested tiers flattened)."""
    if isinstance(cache, TieredProgramCache):
        return [leaf for tier in cache.tiers for leaf in leaf_tiers(tier)]
    return [cache]


__all__ = ["Deferred", "TieredProgramCache", "leaf_tiers"]
