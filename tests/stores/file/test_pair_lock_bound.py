"""A shard's pair lock held by a peer that never lets go (stopped with SIGSTOP, frozen, or a
team member's process) must not block a writer, a remover or a reader forever.

The holder is a real process flocking the shard directory, as a kernelcache writer does
between its two renames; the store is used from another real process with a deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import run_python

from kernelcache import FileStreamProgramCache
from kernelcache.stores.naming import entry_name

KEY = b"k" * 32

HOLD = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


WRITE_THEN_READ = (
    "import sys, warnings\n"
    "from kernelcache import FileStreamProgramCache, KernelCacheWarning\n"
    "c = FileStreamProgramCache(sys.argv[1])\n"
    "with warnings.catch_warnings(record=True) as w:\n"
    "    warnings.simplefilter('always')\n"
    f"    c[{KEY!r}] = b'new value'\n"  # the write is dropped with a warning
    "print(sum(issubclass(x.category, KernelCacheWarning) for x in w))\n"
    f"print(c.get({KEY!r}))\n"  # readers take no lock: the old pair is served
)
DELETE = (
    "import sys\n"
    "from kernelcache import FileStreamProgramCache\n"
    "c = FileStreamProgramCache(sys.argv[1])\n"
    "try:\n"
    f"    del c[{KEY!r}]\n"
    "    print('deleted')\n"
    "except KeyError:\n"
    "    print('KeyError')\n"
    "except OSError:\n"
    "    print('OSError')\n"
)


def test_a_held_shard_lock_is_waited_for_with_a_bound(tmp_path):
    """A writer drops its write with one warning, a reader still gets the old pair, a remover
    reports OSError: each after a bounded wait (the writer and the remover are two processes
    waiting at once, so the test waits out one bound, not two)."""
    root = str(tmp_path / "cache")
    with FileStreamProgramCache(root) as cache:
        cache[KEY] = b"old value"
        shard = os.path.dirname(cache.entry_path(entry_name(KEY)))
    holder = subprocess.Popen([sys.executable, "-c", HOLD, shard], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        children = [
            subprocess.Popen([sys.executable, "-c", code, root], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for code in (WRITE_THEN_READ, DELETE)
        ]
        try:
            outs = [child.communicate(timeout=60) for child in children]
        finally:
            for child in children:
                child.kill()
                child.wait()
        assert [c.returncode for c in children] == [0, 0], [err for _, err in outs]
        assert outs[0][0].split("\n")[:2] == ["1", "b'old value'"]
        assert outs[1][0].split("\n")[:1] == ["OSError"]
    finally:
        holder.kill()
        holder.wait()
    with FileStreamProgramCache(root) as cache:
        assert cache.get(KEY) == b"old value"  # nothing lost


HOLD_STATS = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_held_stats_file_lock_is_waited_for_with_a_bound(tmp_path):
    """The counters file's lockf held by a stopped or foreign process (in a team cache every
    member can lock it): opening the store, a write and a read still finish."""
    root = str(tmp_path / "cache")
    with FileStreamProgramCache(root) as cache:
        cache[KEY] = b"value"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_STATS, os.path.join(root, "v2", "stats")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        out = run_python(
            "import sys, warnings\n"
            "warnings.simplefilter('ignore')\n"
            "from kernelcache import FileStreamProgramCache\n"
            "c = FileStreamProgramCache(sys.argv[1], max_size_bytes=1 << 20)\n"
            f"c[{KEY!r} + b'2'] = b'other'\n"
            f"print(c.get({KEY!r}), c.get({KEY!r} + b'2'))\n",
            root,
            timeout=60,
        )
        assert out.strip() == "b'value' b'other'"
    finally:
        holder.kill()
        holder.wait()
    # What the stall threatens: the entries and the shared size tracker. The writer ended
    # while the lock was still held, so its one write's count could not reach the file
    # (the next reconcile adds it); the file is still every process's tracker.
    with FileStreamProgramCache(root) as cache:
        assert cache.get(KEY) == b"value" and cache.get(KEY + b"2") == b"other"
        on_disk = sum(st.st_size for _, st in cache.scan())
        other = sum(st.st_size for f, st in cache.scan() if f.name.startswith(entry_name(KEY + b"2")))
        assert cache.stats()["size_bytes"] == on_disk - other
        cache[KEY + b"3"] = b"third"
        assert cache.stats()["size_bytes"] == sum(st.st_size for _, st in cache.scan()) - other
