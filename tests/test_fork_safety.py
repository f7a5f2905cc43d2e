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


def _first_call_in_a_forked_child(store) -> bool:  # noqa: ANN001 - a Redis or object store
    """Whether a child forked now finds b"k" in ``store`` on its first call."""
    from helpers import in_forked_child

    got, code = in_forked_child(lambda: store.get(b"k") is not None)
    assert code == 0
    return bool(got)


def test_a_child_forked_while_redis_was_skipped_asks_it_again(tmp_path) -> None:
    """The parent met a stopped Redis and skips it for a minute; Redis is back, and a child forked
    now asks it at once (before: the back-off was the parent's, copied: the child skipped Redis
    for the parent's minute, every look-up a miss)."""
    import warnings

    pytest.importorskip("redis")
    from redis_servers import RedisServer, need_redis

    from kernelcache import RedisProgramCache

    need_redis()
    server = RedisServer(str(tmp_path / "redis"))
    try:
        store = RedisProgramCache(server.url, socket_timeout=0.3, retry_after_s=60)
        store[b"k"] = b"v"
        server.pause()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert store.get(b"other") is None  # one socket timeout: backing off now
        server.resume()
        assert store.stats()["backing_off"] == 1 and store.get(b"k") is None  # the parent still skips it
        assert _first_call_in_a_forked_child(store)
    finally:
        server.stop()


_FORKED_OBJECT_STORE = """
import json, os, sys, warnings
from helpers import in_forked_child
from kernelcache import ObjectStoreProgramCache
store = ObjectStoreProgramCache(sys.argv[1])  # made here; called first in a child

def first_call():
    import signal
    signal.alarm(30)  # a call that hangs ends the child, failing the test, instead of hanging it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store[b"k"] = b"v"
        got = store.get(b"k")
    return [got is not None, [str(w.message) for w in caught]]

before = in_forked_child(first_call)
assert store.get(b"k") == b"v"  # now this process has called obstore
after = in_forked_child(first_call)
print(json.dumps([before, after]))
"""


def test_a_child_forked_after_object_store_calls_skips_it_at_once_never_hangs(s3) -> None:
    """obstore's runtime does not survive fork(): in a child of a process that made object-store
    calls, a call waits forever (before: every look-up of such a child hung). The child skips the
    store with one warning; a child of a process that made none uses it. (A fresh interpreter:
    this one has made object-store calls in other tests.)"""
    from object_servers import env_for

    url = f"s3://{s3.bucket()}/fork"
    env = {**env_for(s3.endpoint), "PYTHONPATH": os.pathsep.join([SUPPORT, os.environ.get("PYTHONPATH", "")])}
    before, after = json.loads(run_python(_FORKED_OBJECT_STORE, url, env=env))
    (hit, said), code = before
    assert code == 0 and hit and said == []  # the parent had made no call: the child uses it
    (hit, said), code = after
    assert code == 0 and not hit
    assert len(said) == 1 and "forked" in said[0] and "spawn" in said[0]


def test_a_child_forked_while_a_thread_counted_copies_hands_out_copies(tmp_path) -> None:
    """A thread of the parent holds the copies' tally lock (integrations/materialized.py) at the
    fork: the child's first copy must not wait on it forever (before: no reset in the child)."""
    import threading

    from helpers import in_forked_child

    from kernelcache.integrations import materialized

    held, go = threading.Event(), threading.Event()

    # The lock a copy's tally takes (named _pending_lock before it was reset through forksafe).
    lock = getattr(materialized, "_pending_lock", None) or materialized._pending.lock

    def hold() -> None:
        with lock:  # held by another thread of the parent at the fork
            held.set()
            go.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(30)
    try:

        def copy() -> str:
            import signal

            signal.alarm(20)  # a child stuck on the lock ends, failing the test, instead of hanging it
            return materialized.materialize(str(tmp_path), "ns", None, "x.bin", b"bytes")

        path, code = in_forked_child(copy)
    finally:
        go.set()
        thread.join()
    assert code == 0 and path is not None
    with open(path, "rb") as f:
        assert f.read() == b"bytes"
