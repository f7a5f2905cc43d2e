"""Redis under faults, single flight across hosts, and counting. Real redis-server processes
stopped and killed, real compiling processes killed with SIGKILL; counts are exact, time bounds
are generous."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
import warnings

import _workers as w
import pytest
from helpers import ARCH
from redis_servers import RedisServer, free_port, need_redis

from kernelcache import (
    CompileInfo,
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    TieredProgramCache,
    compile_program,
)

redis = pytest.importorskip("redis", reason="the redis client is the 'redis' extra: pip install -e '.[dev]'")
from kernelcache import RedisProgramCache  # noqa: E402 - needs the redis client checked above

TRIVIAL = 'extern "C" __global__ void fill(float* a, float v) { a[threadIdx.x] = v; }\n'


@pytest.fixture
def ns() -> str:
    return f"faults{time.time_ns()}"


def compile_trivial(cache, info=None):
    from cuda.core import ProgramOptions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_program(TRIVIAL, options=ProgramOptions(arch=ARCH), cache=cache, info=info)


# -- a stopped or absent server --------------------------------------------------------------


def test_stopped_server_costs_one_timeout_per_compile(tmp_path) -> None:
    need_redis()
    s = RedisServer(str(tmp_path))
    try:
        s.pause()  # SIGSTOP: connections are accepted by the kernel, nothing answers
        rc = RedisProgramCache(s.url, socket_timeout=0.3)  # a fresh store
        info = CompileInfo()
        obj = compile_trivial(rc, info)
        assert bytes(obj.code)[:4] == b"\x7fELF" and not info.hit
        st = rc.stats()
        assert st["errors"] == 1  # one socket timeout: look-up, lock and store did not each pay one
        assert st["skipped_while_down"] >= 2 and st["backing_off"] == 1
        tiers = [FileStreamProgramCache(tmp_path / "disk"), RedisProgramCache(s.url, socket_timeout=0.3)]
        compile_trivial(TieredProgramCache(tiers))
        assert tiers[1].stats()["errors"] == 1
    finally:
        s.stop()


def test_after_the_back_off_one_thread_probes_the_stopped_server(tmp_path) -> None:
    """Race: when the back-off ends, every thread calls at once; one probes, the rest skip."""
    import threading

    need_redis()
    s = RedisServer(str(tmp_path))
    try:
        s.pause()
        # read_only: no fleet counters, so the process's counter thread never calls this
        # store; only the program's threads below do.
        rc = RedisProgramCache(s.url, socket_timeout=0.5, retry_after_s=0.3, read_only=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert rc.get("k") is None
            assert rc.stats()["errors"] == 1
            time.sleep(0.4)  # the back-off is over: the next calls may try the server again
            go = threading.Barrier(8)

            def call() -> None:
                go.wait()
                rc.get("k")

            threads = [threading.Thread(target=call) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert rc.stats()["errors"] == 2  # one more socket timeout, not eight
    finally:
        s.stop()


def test_down_cluster_degrades_like_a_down_server(tmp_path) -> None:
    url = f"redis+cluster://127.0.0.1:{free_port()}"
    rc = RedisProgramCache(url, socket_timeout=0.3)  # no exception: nothing is contacted yet
    with pytest.warns(KernelCacheWarning, match="treated as a miss"):
        assert rc.get("k") is None
    rc["k"] = b"dropped"
    assert rc.stats()["errors"] == 1
    info = CompileInfo()
    compile_trivial(TieredProgramCache([FileStreamProgramCache(tmp_path), RedisProgramCache(url)]), info)
    assert not info.hit
    with pytest.raises(ValueError, match="must start with"):
        RedisProgramCache("http://127.0.0.1:1")


# -- single flight across hosts ----------------------------------------------------------------


def _wait_for_lock(raw, ns: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not list(raw.scan_iter(match=f"{ns}:lock:*")):
        assert time.time() < deadline, "the compiling process never took the Redis lock"
        time.sleep(0.02)


def test_waiter_proceeds_when_its_local_compiling_peer_is_killed(tmp_path, server, ns) -> None:
    """A process of this host holding the Redis lock is SIGKILLed mid-compile: a waiter of
    the same host proceeds at once (the file lock tells), not after the lock's TTL."""
    from sources import HEAVY, needs_bundled_headers

    if needs_bundled_headers.args[0]:
        pytest.skip("this NVRTC has no bundled CUDA/CCCL headers")
    root, ttl = str(tmp_path / "host"), 60.0  # a TTL far longer than the test's bound
    raw = redis.Redis.from_url(server.url)
    peer = mp.get_context("spawn").Process(
        target=w.compile_through_tiers, args=(root, server.url, ns, HEAVY, ARCH, ttl)
    )
    peer.start()
    try:
        _wait_for_lock(raw, ns)
    finally:
        peer.kill()  # SIGKILL while it compiles: its Redis lock stays until its TTL
        peer.join(10)
    assert list(raw.scan_iter(match=f"{ns}:lock:*")), "the dead peer's Redis lock should still be there"
    t0 = time.monotonic()
    hit = w.compile_through_tiers(root, server.url, ns, HEAVY, ARCH, ttl)
    elapsed = time.monotonic() - t0
    assert not hit
    assert elapsed < 30, f"waited {elapsed:.1f} s for a dead local peer"  # old code: 60 s TTL


def test_live_holder_on_another_host_is_not_taken_over(tmp_path, server, ns) -> None:
    """The local-holder check must never take a lock from a live holder elsewhere (race:
    our file lock is not the holder's), and the refresher must keep a short TTL alive."""
    raw = redis.Redis.from_url(server.url)
    holder = mp.get_context("spawn").Process(target=w.hold_redis_lock_forever, args=(server.url, ns, "name", 1.5))
    holder.start()
    try:
        _wait_for_lock(raw, ns)
        mine = tmp_path / "host-b.lock"
        mine.touch()
        rc = RedisProgramCache(server.url, namespace=ns)
        # 4 s: well past the 1.5 s TTL, so only the refresher keeps the holder's lock.
        with rc.remote_lock("name", time.monotonic() + 4, lambda: False, local_lock=str(mine)) as outcome:
            assert outcome == "timeout"
    finally:
        holder.kill()
        holder.join(10)
    with rc.remote_lock("name", time.monotonic() + 20, lambda: False, local_lock=str(mine)) as outcome:
        assert outcome == "acquired"  # by expiry, once the holder is dead


# -- counting what the user did -----------------------------------------------------------------


def host(tmp_path, name: str, url: str, ns: str) -> TieredProgramCache:
    return TieredProgramCache(
        [InMemoryProgramCache(), FileStreamProgramCache(tmp_path / name), RedisProgramCache(url, namespace=ns)]
    )


def counts(stats: dict, names=("hits", "misses", "stores", "compiles")) -> tuple:
    return tuple(int(stats[n]) for n in names)


def test_tiered_counts_what_the_user_did(tmp_path, server, ns) -> None:
    a = host(tmp_path, "a", server.url, ns)
    compile_trivial(a)  # a miss: one compile, one store (the header manifest is not one)
    assert counts(a.stats()) == (0, 1, 1, 1)
    assert [counts(s) for s in a.tier_stats()] == [(0, 1, 1, 1)] * 3
    b = host(tmp_path, "b", server.url, ns)
    compile_trivial(b)  # served by Redis
    compile_trivial(b)  # served by memory
    assert counts(b.stats()) == (2, 0, 0, 0)
    mem, disk, red = b.tier_stats()
    assert counts(mem) == (1, 1, 0, 0) and counts(disk) == (0, 1, 0, 0) and counts(red) == (1, 0, 0, 0)
    assert red["compile_seconds_saved"] > 0 and mem["compile_seconds_saved"] > 0
    assert disk["compile_seconds_saved"] == 0
    c = host(tmp_path, "c", server.url, ns + "-map")
    c["k"] = b"v"
    assert c.get("k") == b"v" and c.get("absent") is None
    assert counts(c.stats()) == (1, 1, 1, 0)
    assert [counts(s) for s in c.tier_stats()] == [(1, 1, 1, 0), (0, 1, 1, 0), (0, 1, 1, 0)]


def test_fleet_counters_add_up_in_redis(tmp_path, server, ns) -> None:
    a, b = host(tmp_path, "a", server.url, ns), host(tmp_path, "b", server.url, ns)
    compile_trivial(a)
    compile_trivial(b)
    compile_trivial(b)  # a memory hit: Redis was not asked, the fleet does not see it
    a.close()
    b.close()
    fleet = RedisProgramCache(server.url, namespace=ns, read_only=True).fleet_stats()
    assert fleet is not None
    assert counts(fleet) == (1, 1, 1, 1) and fleet["compile_seconds_saved"] > 0


def test_fleet_counters_are_batched_not_a_round_trip_per_hit(tmp_path, ns) -> None:
    # A server of its own: the module's is shared, and an earlier test's store that was never
    # closed sends its counts from the process's counter thread at any moment, which the
    # server's command counts (all namespaces) would add to this store's.
    from redis_servers import RedisServer

    server = RedisServer(str(tmp_path / "redis"))
    try:
        raw = redis.Redis.from_url(server.url)
        rc = RedisProgramCache(server.url, namespace=ns)
        rc["k"] = b"v"

        def hincrby_calls() -> int:
            return int(raw.info("commandstats").get("cmdstat_hincrby", {}).get("calls", 0))

        before, t0 = hincrby_calls(), time.monotonic()
        for _ in range(300):
            assert rc["k"] == b"v"
        flushes_allowed = 1 + int(time.monotonic() - t0)  # at most one flush a second
        assert hincrby_calls() - before <= 5 * flushes_allowed  # one HINCRBY per counter per flush
        rc.close()
        assert counts(rc.fleet_stats() or {}) == (300, 0, 1, 0)
    finally:
        server.stop()


def test_fleet_counters_are_written_at_exit(server, ns) -> None:
    code = (
        "import warnings; from kernelcache import RedisProgramCache as R\n"
        f"rc = R({server.url!r}, namespace={ns!r})\n"
        "rc['k'] = b'v'\n"
        "[rc.get('k') for _ in range(7)]; [rc.get('absent') for _ in range(3)]\n"  # no close()
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ), timeout=60)
    fleet = RedisProgramCache(server.url, namespace=ns).fleet_stats()
    assert fleet is not None and counts(fleet) == (7, 3, 1, 0)


# -- the CLI ----------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def test_cli_stats_shows_the_fleet(tmp_path, server, ns) -> None:
    import json

    for name in ("a", "b"):
        with host(tmp_path, name, server.url, ns) as h:
            compile_trivial(h)
    out = _cli("stats", "--cache-dir", str(tmp_path / "b"), "--redis", server.url, "--redis-namespace", ns, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    fleet = data["fleet"]
    assert (fleet["hits"], fleet["misses"], fleet["compiles"]) == (1, 1, 1)
    # Kernels as ls lists them; the records are the artifact and its source's index (a source
    # that names no header needs no header manifest)
    assert fleet["entries"] == 1 and fleet["records"] == 2
    assert (data["disk"]["hits"], data["disk"]["misses"]) == (0, 1)  # host b's disk: it missed there


def test_cli_stats_unreachable_redis_is_one_line_and_the_disk_is_still_shown(tmp_path) -> None:
    out = _cli("stats", "--cache-dir", str(tmp_path), "--redis", "redis://127.0.0.1:1/0")
    assert out.returncode == 0, out.stderr  # the disk could be read: its figures, and one line for Redis
    said = (out.stdout + out.stderr).strip().splitlines()
    assert sum("127.0.0.1:1" in line for line in said) == 1, said
    assert "Traceback" not in out.stderr and "Warning" not in out.stderr
    bad = _cli("stats", "--cache-dir", str(tmp_path), "--redis", "http://127.0.0.1:1")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_tiered_counts_stay_exact_with_threads(tmp_path, server, ns) -> None:
    """Race: threads of one process share a tiered store; a hit is counted in the tier of
    that thread's own look-up, whatever the other threads look up meanwhile (here: probes
    that miss every tier, through Redis)."""
    import threading

    from cuda.core import ProgramOptions

    from kernelcache import probe

    def src(k: int) -> str:
        return f'extern "C" __global__ void k{k}(float* a) {{ a[threadIdx.x] = {k}.0f; }}\n'

    b = host(tmp_path, "b", server.url, ns)
    for k in range(4):
        compile_program(src(k), options=ProgramOptions(arch=ARCH), cache=b)
    b.zero_stats()
    go = threading.Barrier(8)
    rounds = 1000

    def hits(k: int) -> None:
        go.wait()
        for _ in range(rounds):
            compile_program(src(k), options=ProgramOptions(arch=ARCH), cache=b)  # a memory hit

    def misses(k: int) -> None:
        go.wait()
        for _ in range(rounds):
            # PTX is keyed without a header manifest: every probe reads each tier, and misses.
            probe(f"// absent {k}\n", code_type="ptx", options=ProgramOptions(arch=ARCH), cache=b)

    threads = [threading.Thread(target=hits, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=misses, args=(k,)) for k in range(4)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: between a look-up and its count
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    mem, disk, red = b.tier_stats()
    assert counts(mem) == (4 * rounds, 0, 0, 0) and counts(disk) == counts(red) == (0, 0, 0, 0)  # probes count nothing
    assert mem["compile_seconds_saved"] > 0 and counts(b.stats()) == (4 * rounds, 0, 0, 0)


def test_fleet_counters_exact_under_threads(server, ns) -> None:
    """Race: threads add to the tally while another thread sends it: nothing lost, nothing twice."""
    import threading

    rc = RedisProgramCache(server.url, namespace=ns)
    rc["k"] = b"v"
    done: list[int] = []
    stop_at = time.monotonic() + 2.5  # several flushes happen while the threads count

    def reader() -> None:
        n = 0
        while time.monotonic() < stop_at:
            rc.get("k")
            n += 1
        done.append(n)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rc.close()
    fleet = RedisProgramCache(server.url, namespace=ns, read_only=True).fleet_stats()
    assert fleet is not None and fleet["hits"] == sum(done) and fleet["stores"] == 1
