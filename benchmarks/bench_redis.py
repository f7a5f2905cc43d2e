"""RedisProgramCache and TieredProgramCache on a real redis-server (started here, on loopback).

    python benchmarks/bench_redis.py            # K=4 heavy kernels per host
    python benchmarks/bench_redis.py --kernels 8

Hit latency through Redis (16 KiB and 1 MiB entries) and through the tiered cache after
promotion; then "two hosts": two processes with separate local cache directories and one
Redis, K heavy kernels each, started together: total compiles (target: K, not 2K), and a
third host's cold start (everything already in Redis) vs compiling.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _timing import median_us

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "support"))

from bench_compile import HEAVY, heavy_options  # noqa: E402
from redis_servers import RedisServer  # noqa: E402


def host(root: str, url: str, ns: str, kernels: int, start_at: float) -> tuple[int, float]:
    from kernelcache import (
        FileStreamProgramCache,
        InMemoryProgramCache,
        RedisProgramCache,
        TieredProgramCache,
        compile_program,
    )

    cache = TieredProgramCache(
        [InMemoryProgramCache(), FileStreamProgramCache(root), RedisProgramCache(url, namespace=ns)]
    )
    while time.time() < start_at:
        time.sleep(0.001)
    t = time.perf_counter()
    for v in range(kernels):
        compile_program(HEAVY.format(variant=v), options=heavy_options(), cache=cache)
    return int(cache.stats()["compiles"]), time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=4)
    args = parser.parse_args()
    from kernelcache import FileStreamProgramCache, InMemoryProgramCache, RedisProgramCache, TieredProgramCache

    work = tempfile.mkdtemp(prefix="kc-bench-redis-")
    server = RedisServer(work)
    try:
        rc = RedisProgramCache(server.url, namespace="bench")
        version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
        print(f"redis-server {version} on 127.0.0.1:{server.port}")
        import redis

        raw = redis.Redis.from_url(server.url)
        print(f"round trip floor here (raw redis-py PING): {median_us(raw.ping):9.1f} us")
        for label, size in (("16 KiB", 16 * 1024), ("1 MiB", 1024 * 1024)):
            payload = os.urandom(size)
            rc[f"k{size}"] = payload
            raw.set(f"raw{size}", payload)
            ours = median_us(lambda s=size: rc[f"k{s}"])
            plain = median_us(lambda s=size: raw.get(f"raw{s}"))
            print(
                f"Redis get (hit, {label}): ours {ours:9.1f} us, raw redis-py GET {plain:9.1f} us, "
                f"ours/raw {ours / plain:.2f} (ours also verifies the digest and parses metadata)"
            )
        tiered = TieredProgramCache(
            [
                InMemoryProgramCache(),
                FileStreamProgramCache(os.path.join(work, "t")),
                RedisProgramCache(server.url, namespace="bench"),
            ]
        )
        tiered.get(f"k{16 * 1024}")  # promoted into memory and disk
        print(f"Tiered get after promotion (16 KiB, from memory): {median_us(lambda: tiered[f'k{16 * 1024}']):9.1f} us")
        tiered.close()
        rc.close()  # their fleet counters are sent now, while the server still runs

        ns = f"two-hosts-{time.time_ns()}"
        ctx = mp.get_context("spawn")
        start_at = time.time() + 3
        with ctx.Pool(2) as pool:
            results = pool.starmap(
                host, [(os.path.join(work, h), server.url, ns, args.kernels, start_at) for h in ("h1", "h2")]
            )
        compiles = sum(r[0] for r in results)
        print(
            f"two hosts x K={args.kernels} heavy kernels, started together: {compiles} compiles in total "
            f"(target {args.kernels}; {2 * args.kernels} without sharing); wall per host: "
            + ", ".join(f"{r[1]:.2f} s" for r in results)
        )
        with ctx.Pool(1) as pool:
            ((third_compiles, third_wall),) = pool.starmap(
                host, [(os.path.join(work, "h3"), server.url, ns, args.kernels, 0)]
            )
            ((cold_compiles, cold_wall),) = pool.starmap(
                host, [(os.path.join(work, "h4"), server.url, ns + "-empty", args.kernels, 0)]
            )
        print(
            f"a third host's cold start from Redis: {third_wall:.3f} s ({third_compiles} compiles) vs compiling: "
            f"{cold_wall:.2f} s ({cold_compiles} compiles); ratio {third_wall / cold_wall:.4f}"
        )
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
