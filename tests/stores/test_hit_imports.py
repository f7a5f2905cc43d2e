"""A hit from a near tier loads nothing of the far ones: no client library imported, no connection
made, until a call needs that tier (each case a real, fresh process on a real cache directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ARCH, run_python

# One fresh process: a compile_program call, then what it found and what is loaded.
CHILD = f"""
import json, sys
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
cache = FileStreamProgramCache(sys.argv[2]) if sys.argv[2] else None
info = CompileInfo()
compile_program(sys.argv[1], options=ProgramOptions(arch={ARCH!r}), cache=cache, info=info)
heavy = ("redis", "obstore", "triton", "torch", "cupy", "rich", "click", "platformdirs", "logging", "decimal",
         "kernelcache.config.urls", "kernelcache.config.oci")
print(json.dumps({{"hit": info.hit, "loaded": sorted(m for m in heavy if m in sys.modules)}}))
"""
SRC = 'extern "C" __global__ void k(float* a) {{ a[threadIdx.x] = {}.0f; }}'


def child(source: str, store: str = "", **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    out = run_python(CHILD, source, store, env={**clean, **env})
    return json.loads(out.strip().splitlines()[-1])


def test_a_hit_from_disk_loads_no_remote_client_nor_anything_a_miss_needs(tmp_path) -> None:
    """Proven on the process's own sys.modules: the first call (a miss) and a fresh process's hit,
    which loads no URL or OCI-reference parsing either (a store given names no URL)."""
    store = str(tmp_path / "c")
    assert child(SRC.format(1), store)["hit"] is False
    got = child(SRC.format(1), store)
    assert got == {"hit": True, "loaded": []}


def test_with_a_redis_url_a_hit_from_disk_neither_imports_redis_nor_connects(tmp_path) -> None:
    """The default cache is memory -> disk -> Redis; an entry on disk is served with Redis untouched
    (the server counts no connection from that process); a miss then reaches Redis."""
    pytest.importorskip("redis", reason="the redis client is the 'redis' extra")
    from redis_servers import RedisServer, need_redis

    need_redis()
    server = RedisServer(str(tmp_path))
    try:
        kc_dir = str(tmp_path / "kc")
        assert child(SRC.format(2), KERNELCACHE_DIR=kc_dir)["hit"] is False  # on disk only: no Redis yet

        def connections() -> int:
            stats = server.cli("info", "stats")
            return int(
                next(line for line in stats.splitlines() if line.startswith("total_connections_received:")).split(":")[
                    1
                ]
            )

        before = connections()
        got = child(SRC.format(2), KERNELCACHE_DIR=kc_dir, KERNELCACHE_REDIS_URL=server.url)
        assert got["hit"] is True and "redis" not in got["loaded"]
        assert connections() - before == 1  # that one is this INFO's own
        assert server.cli("dbsize") == "0"
        # A miss needs Redis: the client is imported then, and the entry is written there.
        got = child(SRC.format(3), KERNELCACHE_DIR=kc_dir, KERNELCACHE_REDIS_URL=server.url)
        assert got["hit"] is False and "redis" in got["loaded"]
        assert int(server.cli("dbsize")) >= 1
    finally:
        server.stop()


def test_with_a_redis_url_a_hit_from_disk_loads_none_of_the_redis_tier_code(tmp_path) -> None:
    """Beyond the same hit without the URL, a hit from disk with KERNELCACHE_REDIS_URL set loads the
    tiered store and its memory tier only: no module of kernelcache.stores.redis (the tier's code,
    its connection helpers) until a call reaches Redis. Compared on two fresh processes' sys.modules."""
    pytest.importorskip("redis", reason="the redis client is the 'redis' extra")
    from redis_servers import RedisServer, need_redis

    need_redis()
    server = RedisServer(str(tmp_path))
    try:
        kc_dir = str(tmp_path / "kc")
        listing = CHILD.replace('print(json.dumps({"hit"', 'print(json.dumps({"modules": sorted(sys.modules), "hit"')
        assert listing != CHILD

        def modules(**env: str) -> tuple[bool, set[str]]:
            clean = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
            out = json.loads(run_python(listing, SRC.format(4), "", env={**clean, **env}).strip().splitlines()[-1])
            return out["hit"], set(out["modules"])

        assert modules(KERNELCACHE_DIR=kc_dir)[0] is False  # the miss that puts the entry on disk
        hit, plain = modules(KERNELCACHE_DIR=kc_dir)
        assert hit is True
        hit, with_url = modules(KERNELCACHE_DIR=kc_dir, KERNELCACHE_REDIS_URL=server.url)
        assert hit is True
        assert sorted(m for m in with_url if m.startswith("kernelcache.stores.redis")) == []
        assert sorted(with_url - plain) == ["kernelcache.stores.memory", "kernelcache.stores.tiered"]
        assert server.cli("dbsize") == "0"  # served from disk: nothing was written to Redis either
    finally:
        server.stop()


def test_with_a_redis_url_and_no_redis_client_the_default_cache_is_a_config_error(tmp_path) -> None:
    """The client's presence is still checked when the default cache is made (not on a first miss):
    a real interpreter without site-packages (-S: no redis-py there) gets ConfigError naming the extra."""
    import kernelcache

    src = os.path.dirname(os.path.dirname(os.path.abspath(kernelcache.__file__)))
    code = (
        f"import sys; sys.path.insert(0, {src!r})\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('redis') is None, 'redis-py is importable without site-packages'\n"
        "from kernelcache import config\n"
        "from kernelcache.stores.default import default_cache\n"
        "try:\n"
        "    default_cache()\n"
        "except config.ConfigError as exc:\n"
        "    print('ConfigError:', exc)\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELCACHE_", "PYTHON"))}
    env = {**clean, "KERNELCACHE_REDIS_URL": "redis://127.0.0.1:1/0", "KERNELCACHE_DIR": str(tmp_path / "kc")}
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ConfigError: KERNELCACHE_REDIS_URL is set but the redis client")
    assert "pip install 'kernelcache[redis]'" in out.stdout
