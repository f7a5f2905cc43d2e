"""fork() while other threads use a store: the child neither hangs on a lock another thread
held at the fork nor counts the parent's pending counts again; a multiprocessing worker made
by fork writes its last counts though it ends without atexit. Real forks, real threads, a
real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import SUPPORT, run_python

HERE = SUPPORT


def _fork_hits(env: dict[str, str], children: int = 40) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "_fork_hits.py"), str(children)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_children_forked_during_hits_on_the_redis_tiered_default_cache_do_not_hang(tmp_path, server) -> None:
    pytest.importorskip("redis")
    out = _fork_hits({"KERNELCACHE_DIR": str(tmp_path / "c"), "KERNELCACHE_REDIS_URL": server.url})
    assert out["hung"] == 0


def test_children_forked_during_hits_count_each_hit_once(tmp_path) -> None:
    out = _fork_hits({"KERNELCACHE_DIR": str(tmp_path / "c")})
    assert out["hung"] == 0
    assert out["counted"] == out["taken"]  # the parent's pending hits are not counted by each child


WORKER = """
import multiprocessing as mp, os, sys, warnings
warnings.simplefilter("ignore")
from kernelcache import FileStreamProgramCache
from kernelcache.stores.file.counters import FileStats

def work(root):
    cache = FileStreamProgramCache(root)
    for _ in range(7):
        assert cache.get(b"key") == b"value"

if __name__ == "__main__":
    root = sys.argv[1]
    FileStreamProgramCache(root)[b"key"] = b"value"
    p = mp.get_context("fork").Process(target=work, args=(root,))
    p.start()
    p.join()
    assert p.exitcode == 0
    print(FileStats(os.path.join(root, "v2", "stats")).snapshot()["hits"])
"""


def test_a_fork_workers_last_counts_are_written(tmp_path) -> None:
    assert run_python(WORKER, str(tmp_path / "c")).strip() == "7"
