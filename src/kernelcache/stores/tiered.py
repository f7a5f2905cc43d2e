"""TieredProgramCache: memory -> disk -> Redis; hits are promoted upward, writes go everywhere."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from kernelcache.stores.base import Meta, ProgramCacheResource, RecordStore


class TieredProgramCache(RecordStore):
    """Reads walk ``tiers`` in order; a hit in a lower tier is copied into every tier above it.

    Writes go to every tier (a read-only Redis tier skips them). ``stats()`` counts what the
    user sees (one hit or miss per look-up); ``tier_stats()`` gives each tier's own counters.
    Single flight uses the first file tier's locks (processes of this host) and the first
    Redis tier's lock (every host sharing the server).
    """

    def __init__(self, tiers: Sequence[ProgramCacheResource]) -> None:
        super().__init__()
        tiers = list(tiers)
        if not tiers:
            raise ValueError("TieredProgramCache needs at least one tier, e.g. [InMemoryProgramCache(), ...]")
        for t in tiers:
            if not isinstance(t, ProgramCacheResource):
                raise TypeError(f"every tier must be a ProgramCacheResource, not {type(t).__name__}")
        self.tiers = tiers

    def _read(self, key: bytes, want_meta: bool = True) -> tuple[bytes, Meta] | None:
        for i, tier in enumerate(self.tiers):
            # Each tier counts its own hits and misses (tier_stats shows where look-ups end);
            # this store's own counters are what the caller sees.
            record = tier.get_record(key)
            if record is not None:
                for upper in self.tiers[:i]:  # promote: the next look-up stops higher up
                    upper.set_record(key, record[0], record[1], internal=True)
                return record
        return None

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        written = False
        for tier in self.tiers:
            written = tier.set_record(key, payload, meta) or written
        return written

    def _remove(self, key: bytes) -> bool:
        removed = False
        for tier in self.tiers:
            if getattr(tier, "read_only", False):
                continue
            try:
                del tier[key]
                removed = True
            except KeyError:
                pass
        return removed

    def __len__(self) -> int:
        return max((len(t) for t in self.tiers), default=0)

    def clear(self) -> None:
        for tier in self.tiers:
            if not getattr(tier, "read_only", False):
                tier.clear()

    def lock_path(self, name: str) -> str | None:
        for tier in self.tiers:
            if hasattr(tier, "lock_path"):
                return tier.lock_path(name)
        return None

    @contextlib.contextmanager
    def remote_lock(self, name: str, deadline: float, ready: Any) -> Iterator[str]:
        for tier in self.tiers:
            if hasattr(tier, "remote_lock"):
                with tier.remote_lock(name, deadline, ready) as outcome:
                    yield outcome
                return
        yield "unavailable"

    def tier_stats(self) -> list[dict[str, float | int]]:
        return [t.stats() for t in self.tiers]

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()


__all__ = ["TieredProgramCache"]
