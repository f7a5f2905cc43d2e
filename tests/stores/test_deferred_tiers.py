"""A deferred tier is made when a look-up, a write or a tool first reaches it, once, and never
for a hit that a nearer tier serves (real stores throughout; the factory counts its calls)."""

from __future__ import annotations

import threading

from kernelcache import FileStreamProgramCache, InMemoryProgramCache, TieredProgramCache
from kernelcache.stores.tiered import Deferred


def tiered(tmp_path, made: list) -> tuple[TieredProgramCache, FileStreamProgramCache]:
    disk = FileStreamProgramCache(tmp_path / "disk")

    def make() -> InMemoryProgramCache:
        made.append(1)
        return InMemoryProgramCache()

    return TieredProgramCache([InMemoryProgramCache(), disk, Deferred(make, read_only=False, name="far")]), disk


def test_a_hit_from_a_nearer_tier_never_makes_the_deferred_one(tmp_path) -> None:
    made: list = []
    cache, disk = tiered(tmp_path, made)
    disk.set_record(b"k", b"v", {"log": ""})
    for _ in range(3):
        assert cache.get_record(b"k") == (b"v", {"log": ""})
        assert cache.get_record_uncounted(b"k") is not None
        cache.add_stats(hits=1, bytes_read=1)
    assert cache.get_many([b"k"])[0] is not None
    assert cache.lock_path("x") is not None and cache.file_root is not None and cache.tmp_dir is not None
    assert cache.read_only is False
    cache.close()
    assert made == []


def test_a_miss_makes_it_once_and_later_calls_use_that_store(tmp_path) -> None:
    """Eight threads miss at once: one store is made, and what one thread writes the others read."""
    made: list = []
    cache, _ = tiered(tmp_path, made)
    start = threading.Barrier(8)

    def miss() -> None:
        start.wait()
        assert cache.get_record(b"absent") is None

    threads = [threading.Thread(target=miss) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [1]
    far = cache.tiers[2]
    assert isinstance(far, InMemoryProgramCache)
    cache.set_record(b"w", b"x")
    assert far.get_record(b"w") is not None and made == [1]
