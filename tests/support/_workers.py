"""Functions that run in child processes (spawned: a real separate interpreter each)."""

from __future__ import annotations

import os
import time
import warnings

from startline import arrive

from kernelcache import FileStreamProgramCache


def payload_for(writer: int, size: int) -> bytes:
    # Every byte says which writer wrote it: a torn read (two writers' bytes) is visible.
    return bytes([writer % 256]) * size


def write_same_key(root: str, writer: int, rounds: int, size: int) -> None:
    warnings.simplefilter("ignore")
    cache = FileStreamProgramCache(root)
    for _ in range(rounds):
        cache["shared"] = payload_for(writer, size)
    cache.close()


def read_until(root: str, deadline: float, writers: int, size: int, started: str, done: str) -> tuple[int, int, int]:
    """(reads that returned bytes, misses, torn reads): reading until the file ``done`` exists
    (or the deadline passes), creating the file ``started`` after the first read."""
    warnings.simplefilter("ignore")
    cache = FileStreamProgramCache(root)
    valid = {payload_for(w, size) for w in range(writers)}
    hits = misses = torn = 0
    while time.time() < deadline:
        data = cache.get("shared")
        if data is None:
            misses += 1
        elif data in valid:
            hits += 1
        else:
            torn += 1
        if not os.path.exists(started):
            open(started, "w").close()
        elif os.path.exists(done):
            break
    cache.close()
    return hits, misses, torn


def write_distinct_keys(root: str, writer: int, count: int) -> None:
    cache = FileStreamProgramCache(root)
    for i in range(count):
        cache[f"{writer}-{i}"] = f"{writer}-{i}".encode() * 50
    cache.close()


def hits_and_misses(root: str, hits: int, misses: int) -> None:
    cache = FileStreamProgramCache(root)
    for _ in range(hits):
        assert cache.get("present") is not None
    for i in range(misses):
        assert cache.get(f"absent-{os.getpid()}-{i}") is None
    cache.close()


def churn_capped(root: str, writer: int, rounds: int, cap: int) -> int:
    """Rewrite and read a small key set under a tight cap; return torn reads seen."""
    warnings.simplefilter("ignore")
    cache = FileStreamProgramCache(root, max_size_bytes=cap)
    torn = 0
    for r in range(rounds):
        key = f"k{(r * 7 + writer) % 40}"
        cache[key] = key.encode() * 100
        got = cache.get(f"k{(r * 3) % 40}")
        if got is not None and got != f"k{(r * 3) % 40}".encode() * 100:
            torn += 1
    cache.close()
    return torn


def write_forever(root: str, size: int) -> None:
    """Write big entries until killed (the test kills it with SIGKILL)."""
    cache = FileStreamProgramCache(root)
    i = 0
    while True:
        cache[f"big-{i % 5}"] = payload_for(i, size)
        i += 1


def compile_heavy(root: str, code: str, arch: str, store: str = "kernelcache") -> tuple[bool, bytes]:
    """compile_program in a separate process into kernelcache's (or, store="cuda.core", cuda.core's own)
    FileStreamProgramCache at root; (hit, artifact bytes)."""
    from cuda.core import ProgramOptions
    from cuda.core.utils import FileStreamProgramCache as CudaCoreFileStream

    from kernelcache import CompileInfo, compile_program

    info = CompileInfo()
    obj = compile_program(
        code,
        options=ProgramOptions(arch=arch, use_bundled_headers=True, std="c++17"),
        cache=CudaCoreFileStream(root) if store == "cuda.core" else FileStreamProgramCache(root),
        info=info,
    )
    return info.hit, bytes(obj.code)


def host_compiles(root: str, url: str, namespace: str, kernels: int, gate: str, parties: int, arch: str) -> int:
    """One "host": its own memory and disk tiers, a shared Redis; returns its compile count."""
    from cuda.core import ProgramOptions

    from kernelcache import InMemoryProgramCache, RedisProgramCache, TieredProgramCache, compile_program

    cache = TieredProgramCache(
        [InMemoryProgramCache(), FileStreamProgramCache(root), RedisProgramCache(url, namespace=namespace)]
    )
    arrive(gate, parties)
    for k in range(kernels):
        src = f'extern "C" __global__ void k{k}(float* a) {{ a[threadIdx.x] = {k}.0f * a[threadIdx.x]; }}\n'
        compile_program(src, options=ProgramOptions(arch=arch), cache=cache)
    return int(cache.stats()["compiles"])


def compile_through_tiers(root: str, url: str, namespace: str, code: str, arch: str, lock_ttl_s: float) -> bool:
    """One compile_program through [disk, Redis] tiers, as a host's process does; hit?"""
    from cuda.core import ProgramOptions

    from kernelcache import CompileInfo, RedisProgramCache, TieredProgramCache, compile_program

    warnings.simplefilter("ignore")
    cache = TieredProgramCache(
        [FileStreamProgramCache(root), RedisProgramCache(url, namespace=namespace, lock_ttl_s=lock_ttl_s)]
    )
    info = CompileInfo()
    compile_program(
        code, options=ProgramOptions(arch=arch, use_bundled_headers=True, std="c++17"), cache=cache, info=info
    )
    return info.hit


def hold_redis_lock_forever(url: str, namespace: str, name: str, ttl_s: float = 1.0) -> None:
    from kernelcache import RedisProgramCache

    rc = RedisProgramCache(url, namespace=namespace, lock_ttl_s=ttl_s)
    with rc.remote_lock(name, time.monotonic() + 60, lambda: False) as outcome:
        assert outcome == "acquired"
        time.sleep(600)


def set_in_lockstep(root: str, writer: int, rounds: int, barrier: object) -> None:
    """Write key r<i> at the same moment as the other writer (a barrier per round)."""
    warnings.simplefilter("ignore")
    cache = FileStreamProgramCache(root)
    value = b"A" * 3000 if writer == 0 else b"B" * 5000
    for r in range(rounds):
        barrier.wait()  # type: ignore[attr-defined]
        cache[f"r{r}"] = value + b"%d" % r
    cache.close()


def write_forever_counting(root: str, size: int, started: object) -> None:
    """Write big entries until killed; ``started`` (a shared int) counts writes begun."""
    cache = FileStreamProgramCache(root)
    i = 0
    while True:
        with started.get_lock():  # type: ignore[attr-defined]
            started.value += 1  # type: ignore[attr-defined]
        cache[f"big-{i % 5}"] = payload_for(i, size)
        i += 1
