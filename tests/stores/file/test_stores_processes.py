"""FileStreamProgramCache under real concurrent processes: no torn reads, exact counts, kill -9."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import _workers as w
import pytest

from kernelcache import FileStreamProgramCache
from kernelcache.cli.entries import read_verified
from kernelcache.stores.file.store import FORMAT_DIR

CTX = mp.get_context("spawn")  # a fresh interpreter per process, as separate programs would be


def test_concurrent_writers_of_one_key_and_readers_see_no_torn_reads(tmp_path) -> None:
    root = str(tmp_path)
    writers, size = 4, 256 * 1024
    FileStreamProgramCache(root)["shared"] = w.payload_for(0, size)
    started = [str(tmp_path / f"reader-{n}-started") for n in range(2)]
    done = str(tmp_path / "writers-done")
    with CTX.Pool(writers + 2) as pool:
        deadline = time.time() + 120
        readers = [pool.apply_async(w.read_until, (root, deadline, writers, size, s, done)) for s in started]
        # The writers start once both readers read: every write overlaps their reads.
        while not all(os.path.exists(s) for s in started):
            assert time.time() < deadline and not any(r.ready() for r in readers), "the readers never read"
            time.sleep(0.001)
        jobs = [pool.apply_async(w.write_same_key, (root, n, 60, size)) for n in range(writers)]
        for job in jobs:
            job.get(timeout=120)
        open(done, "w").close()  # the readers stop at their next read
        results = [r.get(timeout=120) for r in readers]
    assert sum(r[2] for r in results) == 0, "a reader saw bytes from two writers"
    assert sum(r[0] for r in results) > 0
    final = FileStreamProgramCache(root).get("shared")
    # Not None: readers racing the writers never take a pair mid-publication for damage.
    assert final in {w.payload_for(n, size) for n in range(writers)}
    assert not os.listdir(os.path.join(root, FORMAT_DIR, "tmp"))


def test_concurrent_writers_of_distinct_keys_and_exact_store_count(tmp_path) -> None:
    root = str(tmp_path)
    with CTX.Pool(4) as pool:
        pool.starmap(w.write_distinct_keys, [(root, n, 50) for n in range(4)])
    cache = FileStreamProgramCache(root)
    assert len(cache) == 200
    for n in range(4):
        for i in range(50):
            assert cache[f"{n}-{i}"] == f"{n}-{i}".encode() * 50
    assert cache.stats()["stores"] == 200


def test_stats_are_exact_across_processes(tmp_path) -> None:
    root = str(tmp_path)
    FileStreamProgramCache(root)["present"] = b"x"
    with CTX.Pool(4) as pool:
        pool.starmap(w.hits_and_misses, [(root, 300, 100)] * 4)
    stats = FileStreamProgramCache(root).stats()
    assert stats["hits"] == 1200 and stats["misses"] == 400 and stats["stores"] == 1


def test_eviction_racing_rewrites(tmp_path) -> None:
    root = str(tmp_path)
    cap = 20 * 500
    with CTX.Pool(4) as pool:
        torn = pool.starmap(w.churn_capped, [(root, n, 400, cap) for n in range(4)])
    assert sum(torn) == 0
    cache = FileStreamProgramCache(root, max_size_bytes=cap)
    true_size = cache._sizecap.reconcile()
    assert true_size <= cap + 4 * 600  # each racing writer may overshoot by one entry
    survivors = list(cache.iter_entries())
    assert survivors
    for entry in survivors:  # every surviving entry still verifies: sidecar check, size, SHA-256
        assert entry.meta is not None and read_verified(entry) is not None, entry.name
    names = {e.name for e in survivors}
    orphans = [f.name for f, _ in cache.scan() if f.name.endswith(".meta") and f.name[:-5] not in names]
    assert orphans == []
    for i in range(40):
        got = cache.get(f"k{i}")
        assert got is None or got == f"k{i}".encode() * 100


@pytest.mark.parametrize(("nth", "offset"), [(2, 0.0), (3, 0.004), (4, 0.015)])
def test_writer_killed_mid_write_leaves_no_partial_entry(tmp_path, nth: int, offset: float) -> None:
    root = str(tmp_path)
    size = 8 * 1024 * 1024
    started = CTX.Value("i", 0)  # the child counts each write it begins, right before it
    proc = CTX.Process(target=w.write_forever_counting, args=(root, size, started))
    proc.start()
    deadline = time.monotonic() + 120
    while started.value < nth:  # the nth write has begun: earlier ones are published
        assert time.monotonic() < deadline and proc.is_alive(), "the writer never got to its writes"
        time.sleep(0.0002)
    time.sleep(offset)  # staging, fsync or publication of an 8 MB entry: each takes milliseconds
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=30)
    assert proc.exitcode == -signal.SIGKILL
    assert started.value in (nth, nth + 1)  # killed inside a write, not between runs
    cache = FileStreamProgramCache(root)
    for i in range(5):
        got = cache.get(f"big-{i}")
        # Absent, or one whole write: every payload_for is one byte repeated (not a set of all
        # 256 of them: 2 GB built and hashed, 2.5 s of the test).
        assert got is None or got == w.payload_for(got[0], size)
    for i in range(nth - 1):  # the writes that finished before the kill are all there, whole
        assert cache.get(f"big-{i}") == w.payload_for(i, size)
    # Its staged temp files are orphans: a later open sweeps them once they are old.
    FileStreamProgramCache(root, tmp_max_age_s=0)
    assert not os.listdir(os.path.join(root, FORMAT_DIR, "tmp"))
