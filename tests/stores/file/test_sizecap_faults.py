"""The size cap holds after faults, and a hit never waits on them.

Each fault is real: a separate process holding the counters file's lock, stopped with
SIGSTOP; an immutable shard (chattr +i); another program's files in tmp/. After each, the
invariant is checked, not only the warning: what is on disk stays within the cap plus one
value, and the shared size tracker says exactly what is on disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from test_pair_lock_bound import HOLD_STATS

from kernelcache import FileStreamProgramCache, KernelCacheWarning
from kernelcache.stores.file.counters import FileStats
from kernelcache.stores.file.store import FORMAT_DIR

CAP = 20_000
VALUE = 1000
ONE_VALUE = 1300  # a value and its sidecar

def disk_bytes(root: str, *, tmp: bool = False) -> int:
    """Bytes of every file under entries/ (and tmp/): what the tracker must say."""
    total = 0
    for sub in ("entries", "tmp") if tmp else ("entries",):
        for d, _, files in os.walk(os.path.join(root, FORMAT_DIR, sub)):
            total += sum(os.lstat(os.path.join(d, f)).st_size for f in files)
    return total


def tracked(root: str) -> int:
    return FileStats(os.path.join(root, FORMAT_DIR, "stats")).snapshot()["size_bytes"]


@contextmanager
def counters_lock_held_by_a_stopped_process(root: str) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_STATS, os.path.join(root, FORMAT_DIR, "stats")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.send_signal(signal.SIGSTOP)
        yield
    finally:
        holder.kill()  # a stopped process dies of SIGKILL too; its lock goes with it
        holder.wait()


def test_a_stalled_counters_lock_does_not_stop_the_cap(tmp_path) -> None:
    root = str(tmp_path / "c")
    warnings.simplefilter("ignore", KernelCacheWarning)
    cache = FileStreamProgramCache(root, max_size_bytes=CAP)
    for i in range(10):
        cache[f"before{i}"] = b"b" * VALUE
    with counters_lock_held_by_a_stopped_process(root):
        cache["during"] = b"d" * VALUE  # its count waits out the bound, then is kept pending
        assert cache.get("during") == b"d" * VALUE
    for i in range(30):
        cache[f"after{i}"] = b"a" * VALUE
    cache.close()
    assert disk_bytes(root) <= CAP + ONE_VALUE
    assert tracked(root) == disk_bytes(root)  # the shared tracker never left the file
    assert FileStreamProgramCache(root).stats()["persistent_stats"] == 1


def test_hits_do_not_wait_for_a_writer_stuck_on_the_counters_lock(tmp_path) -> None:
    root = str(tmp_path / "c")
    warnings.simplefilter("ignore", KernelCacheWarning)
    cache = FileStreamProgramCache(root)
    cache["k"] = b"value"
    cache.zero_stats()
    hits = 0
    with counters_lock_held_by_a_stopped_process(root):
        writer = threading.Thread(target=cache.__setitem__, args=("w", b"written"))
        writer.start()
        time.sleep(0.2)  # the writer now waits for the counters lock (at most its bound)
        while writer.is_alive():
            assert cache.get("k") == b"value"
            hits += 1
        writer.join()
    # Every hit was served while the writer waited (a hit queued behind it would have
    # served one or two before the writer's wait ran out), and each one is counted.
    assert hits > 1000
    cache.close()
    assert FileStreamProgramCache(root).stats()["hits"] == hits
    assert tracked(root) == disk_bytes(root)


def _chattr(flag: str, path: str) -> None:
    proc = subprocess.run(["chattr", flag, path], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"chattr {flag} is not available here: {proc.stderr.strip()}")


def test_a_failed_eviction_still_counts_the_write(tmp_path) -> None:
    root = str(tmp_path / "c")
    cache = FileStreamProgramCache(root, max_size_bytes=CAP)
    cache["old"] = b"o" * 8000
    (entry,) = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if "entries" in d and "." not in f]
    shard = os.path.dirname(entry)
    _chattr("+i", shard)  # eviction's unlink fails there, even for root
    try:
        with pytest.warns(KernelCacheWarning, match="could not evict"):
            for i in range(6):
                cache[f"new{i}"] = b"n" * 3000
        assert cache.get("old") == b"o" * 8000
    finally:
        _chattr("-i", shard)
    cache.close()
    assert tracked(root) == disk_bytes(root)  # the tracker is not left below the disk
    with FileStreamProgramCache(root, max_size_bytes=CAP) as again:
        again["next"] = b"x" * 3000  # the shard is writable again: the cap holds once more
    assert disk_bytes(root) <= CAP + 3300


def test_another_programs_files_in_tmp_count_toward_the_cap(tmp_path) -> None:
    root = str(tmp_path / "c")
    cache = FileStreamProgramCache(root, max_size_bytes=CAP)
    for i in range(5):  # young leftovers of another program: not ours to sweep yet
        with open(os.path.join(root, FORMAT_DIR, "tmp", f"entry-leftover-{i}"), "wb") as f:
            f.write(b"X" * 2000)
    for i in range(600):  # enough evictions for the running process to reconcile
        cache[f"k{i}"] = b"v" * VALUE
    cache.close()
    assert disk_bytes(root, tmp=True) <= CAP + ONE_VALUE
    assert tracked(root) == disk_bytes(root, tmp=True)
