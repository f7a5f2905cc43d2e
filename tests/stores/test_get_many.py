"""get_many: many records in one round trip per tier (Redis: one MGET; an object store: GETs
sent together), and the readers that need many records use it (a Triton group)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import support_script
from redis_servers import REDIS_CLI, need_redis

from kernelcache import FileStreamProgramCache, InMemoryProgramCache, TieredProgramCache


def _mget_and_get_calls(port: int) -> tuple[int, int]:
    out = subprocess.run([REDIS_CLI, "-p", str(port), "info", "commandstats"], capture_output=True, text=True).stdout
    calls = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_") :].split(":", 1)
            calls[name] = int(dict(f.split("=") for f in fields.split(","))["calls"])
    return calls.get("mget", 0), calls.get("get", 0)


def test_redis_answers_get_many_with_one_mget(server, tmp_path) -> None:
    pytest.importorskip("redis")
    need_redis()
    from kernelcache import RedisProgramCache

    redis_store = RedisProgramCache(server.url, namespace=f"many{os.getpid()}")
    keys = [f"k{i}".encode() for i in range(10)]
    for k in keys[:7]:
        redis_store.set_record(k, k + b"-payload", {"n": k.decode()})
    tiered = TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "d"), redis_store])
    subprocess.run([REDIS_CLI, "-p", str(server.port), "config", "resetstat"], check=True, capture_output=True)
    got = tiered.get_many(keys)
    assert [r and r[0] for r in got] == [k + b"-payload" for k in keys[:7]] + [None] * 3
    assert got[0][1] == {"n": "k0"}
    assert _mget_and_get_calls(server.port) == (1, 0)
    assert tiered.stats()["hits"] == 7 and tiered.stats()["misses"] == 3
    # Copied into the tiers above: the next get_many does not reach Redis for those keys.
    tiered.get_many(keys[:7])
    assert _mget_and_get_calls(server.port) == (1, 0)


NAMES = ["kern.source", "kern.ttir", "kern.ptx", "kern.cubin", "kern.json"]
_WORKER = support_script("_triton_worker.py")


def test_a_triton_group_from_the_bucket_is_fetched_in_one_round_trip(tmp_path) -> None:
    pytest.importorskip("triton")
    from object_servers import FaultProxy, S3Server, env_for, need_object_store

    need_object_store()
    s3 = S3Server()
    bucket = s3.bucket()
    base = {**os.environ, "TRITON_CACHE_MANAGER": "kernelcache.triton:KernelCacheManager"}
    base["KERNELCACHE_OBJECT_STORE_URL"] = f"s3://{bucket}/fleet"
    base["TRITON_STORE_BINARY_ONLY"] = "0"  # every member stored, the IRs too: a group of five
    key = "ab" * 32

    def worker(endpoint: str, root: str, *args: str) -> str:
        env = {**base, **env_for(endpoint), "KERNELCACHE_DIR": str(tmp_path / root)}
        out = subprocess.run([sys.executable, _WORKER, *args], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1]

    proxy = FaultProxy(s3.endpoint)
    try:
        worker(s3.endpoint, "writer", "put", key, "v1", *NAMES)
        got = worker(proxy.endpoint, "reader", "get", key, *NAMES)
    finally:
        proxy.stop()
        s3.stop()
    assert all(f'"v1:{name}"' in got for name in NAMES), got
    assert proxy.count("GET") == 1  # the group is one object holding its five members
