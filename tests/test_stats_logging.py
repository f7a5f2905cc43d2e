"""Stats you can zero and trust, and the "kernelcache" logger, through the real entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import ARCH

KERNEL = 'extern "C" __global__ void k%d(float* a) { a[threadIdx.x] = %d.0f; }\n'

# Compile kernels 0..n-1 through the default cache (KERNELCACHE_DIR), `rounds` times each.
COMPILE = f"""
import sys
from cuda.core import ProgramOptions
from kernelcache import compile_program
n, rounds = int(sys.argv[1]), int(sys.argv[2])
if len(sys.argv) > 3:
    import logging
    logging.basicConfig(level=getattr(logging, sys.argv[3]), format="%(levelname)s %(name)s %(message)s",
                        stream=sys.stdout)
for _ in range(rounds):
    for i in range(n):
        compile_program({KERNEL!r} % (i, i), options=ProgramOptions(arch={ARCH!r}))
"""


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def compile_some(cache: str, n: int, rounds: int, *extra: str, env: dict[str, str] | None = None):
    return run([sys.executable, "-c", COMPILE, str(n), str(rounds), *extra], {"KERNELCACHE_DIR": cache, **(env or {})})


def kc(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "kernelcache", *args], {})


def stats(cache: str) -> dict:
    return json.loads(kc("stats", "--json", "--cache-dir", cache).stdout)["disk"]


def test_stats_zero_resets_counters_but_not_the_size(tmp_path) -> None:
    cache = str(tmp_path)
    compile_some(cache, 2, 2)
    before = stats(cache)
    assert (before["compiles"], before["hits"], before["misses"], before["stores"]) == (2, 2, 2, 2)
    out = kc("stats", "--zero", "--cache-dir", cache).stdout
    assert "zeroed" in out and "compiles" in out  # shows what it zeroed
    after = stats(cache)
    assert after["compiles"] == after["hits"] == after["misses"] == after["stores"] == 0
    assert after["compile_seconds_saved"] == 0 and after["errors"] == 0
    assert after["size_bytes"] == before["size_bytes"] > 0 and after["entries"] == 2
    compile_some(cache, 2, 1)  # counting goes on from zero
    assert (stats(cache)["hits"], stats(cache)["compiles"]) == (2, 0)
    zeroed = json.loads(kc("stats", "--zero", "--json", "--cache-dir", cache).stdout)
    assert zeroed["zeroed"] is True and zeroed["disk"]["hits"] == 2


def test_zero_stats_api(tmp_path) -> None:
    from kernelcache import FileStreamProgramCache, InMemoryProgramCache, TieredProgramCache

    mem = InMemoryProgramCache()
    disk = FileStreamProgramCache(tmp_path)
    tiered = TieredProgramCache([mem, disk])
    tiered[b"k"] = b"v"
    assert tiered[b"k"] == b"v" and mem[b"k"] == b"v" and mem.get(b"absent") is None
    assert tiered.stats()["hits"] == 1 and mem.stats()["hits"] >= 1 and mem.stats()["misses"] == 1
    tiered.zero_stats()
    for store in (tiered, mem, disk):
        s = store.stats()
        assert s["hits"] == s["misses"] == s["stores"] == 0, (store, s)
    assert disk.stats()["size_bytes"] > 0 and mem.stats()["size_bytes"] == 1
    # a second handle on the same directory sees the zeroed file counters
    with FileStreamProgramCache(tmp_path) as other:
        assert other.stats()["stores"] == 0


def test_clear_says_whether_it_resets_the_counters(tmp_path) -> None:
    cache = str(tmp_path)
    compile_some(cache, 2, 1)
    out = kc("clear", "--yes", "--cache-dir", cache).stdout
    assert "removed 2 entries" in out and "counters kept" in out and "stats --zero" in out
    assert stats(cache)["compiles"] == 2  # as it said
    data = json.loads(kc("clear", "--yes", "--json", "--cache-dir", cache).stdout)
    assert data == {"removed": 0, "manifests_removed": 0, "path": os.path.realpath(cache), "counters_reset": False}


def test_logging_hit_miss_compile_evict(tmp_path) -> None:
    cache = str(tmp_path)
    out = compile_some(cache, 2, 2, "DEBUG").stdout.splitlines()
    mine = [ln for ln in out if " kernelcache" in ln]
    misses = [ln for ln in mine if ln.startswith("DEBUG kernelcache miss ")]
    hits = [ln for ln in mine if ln.startswith("DEBUG kernelcache hit ")]
    compiled = [ln for ln in mine if ln.startswith("INFO kernelcache compiled ")]
    assert len(misses) == 2 and len(hits) == 2 and len(compiled) == 2, "\n".join(mine)
    assert all(" ms" in ln for ln in misses + hits) and all(" s" in ln for ln in compiled)
    # the key prefix in the log is one that `kernelcache show` accepts as it is
    prefix = hits[0].split()[3]
    assert len(prefix) >= 12
    assert kc("show", prefix, "--cache-dir", cache).returncode == 0
    # INFO: no per-hit lines, the compiles still
    info = compile_some(cache, 3, 1, "INFO").stdout
    assert "hit" not in info and info.count("INFO kernelcache compiled") == 1
    # evictions are INFO
    small = str(tmp_path / "small")
    ev = compile_some(small, 5, 1, "INFO", env={"KERNELCACHE_MAX_SIZE": "12KB"}).stdout
    assert "INFO kernelcache evicted" in ev


def test_logging_warns_about_a_degraded_store(tmp_path) -> None:
    cache = str(tmp_path)
    compile_some(cache, 1, 1)
    entries = [
        os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if "entries" in d and not f.endswith(".meta")
    ]
    artifacts = sorted(entries, key=os.path.getsize)[-1:]  # the cubin (the source index is a small JSON)
    with open(artifacts[0], "r+b") as f:
        f.seek(100)
        f.write(b"\xff\x00\xff")
    out = compile_some(cache, 1, 1, "WARNING").stdout
    assert "WARNING kernelcache" in out and "integrity" in out


def test_no_output_unless_configured(tmp_path) -> None:
    proc = compile_some(str(tmp_path), 2, 2)
    assert proc.stdout == "" and proc.stderr == ""
    small = compile_some(str(tmp_path / "s"), 5, 1, env={"KERNELCACHE_MAX_SIZE": "12KB"})
    assert small.stdout == "" and small.stderr == ""


def test_stats_zero_with_redis_zeroes_the_fleet(tmp_path) -> None:
    import pytest

    pytest.importorskip("redis")
    from redis_servers import RedisServer, need_redis

    need_redis()
    server = RedisServer(str(tmp_path))
    try:
        env = {"KERNELCACHE_REDIS_URL": server.url}
        compile_some(str(tmp_path / "a"), 2, 1, env=env)
        compile_some(str(tmp_path / "b"), 2, 1, env=env)  # another "host": hits from Redis
        fleet = json.loads(kc("stats", "--json", "--redis", server.url, "--cache-dir", str(tmp_path / "b")).stdout)
        assert fleet["fleet"]["hits"] == 2 and fleet["fleet"]["compiles"] == 2
        kc("stats", "--zero", "--redis", server.url, "--cache-dir", str(tmp_path / "b"))
        fleet = json.loads(kc("stats", "--json", "--redis", server.url, "--cache-dir", str(tmp_path / "b")).stdout)
        assert fleet["fleet"]["hits"] == fleet["fleet"]["compiles"] == fleet["fleet"]["misses"] == 0
        assert fleet["disk"]["hits"] == 0 and fleet["fleet"]["entries"] >= 2
    finally:
        server.stop()


def test_logging_warns_when_the_default_directory_is_unusable(tmp_path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)  # another user's directory: refused, the compile goes on uncached
    out = compile_some(str(theirs), 1, 1, "WARNING").stdout
    assert "WARNING kernelcache the default cache directory" in out and "uncached" in out
