"""RedisProgramCache and TieredProgramCache on real redis-server processes (single and cluster)."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import warnings

import _workers as w
import pytest
from helpers import ARCH
from redis_servers import RedisCluster3, RedisServer, need_redis

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
def rc(server):
    ns = f"t{time.time_ns()}"
    cache = RedisProgramCache(server.url, namespace=ns, socket_timeout=0.5)
    yield cache
    cache.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_redis()
    c = RedisCluster3(str(tmp_path_factory.mktemp("cluster")))
    yield c
    c.stop()


# -- the store contract ---------------------------------------------------------------


def test_round_trip_and_key_types(rc) -> None:
    payload = os.urandom(16 * 1024)
    rc["k"] = payload
    assert rc[b"k"] == payload and rc.get("k") == payload
    rc.set_record(b"r", b"bytes", {"log": "warning", "symbols": [["s", "f<int>", "b", "_Z1f"]]})
    assert rc.get_record("r") == (b"bytes", {"log": "warning", "symbols": [["s", "f<int>", "b", "_Z1f"]]})
    with pytest.raises(TypeError):
        rc[1] = b"x"  # type: ignore[index]
    with pytest.raises(KeyError):
        rc["absent"]
    assert not hasattr(type(rc), "__contains__")
    s = rc.stats()
    assert s["hits"] >= 2 and s["misses"] == 1 and s["stores"] == 2


def test_len_and_clear_touch_only_the_namespace(rc, server) -> None:
    other = redis.Redis.from_url(server.url)
    other.set("someone-elses-key", b"keep me")
    neighbour = RedisProgramCache(server.url, namespace=rc._ns + "-neighbour")
    neighbour["n"] = b"keep me too"
    for i in range(30):
        rc[f"k{i}"] = b"x"
    assert len(rc) == 30
    rc.clear()
    assert len(rc) == 0
    assert other.get("someone-elses-key") == b"keep me"
    assert neighbour["n"] == b"keep me too"


def test_ttl_expires_entries(server) -> None:
    rc = RedisProgramCache(server.url, namespace=f"ttl{time.time_ns()}", ttl=1)
    rc["k"] = b"x"
    assert rc.get("k") == b"x"
    time.sleep(1.3)
    assert rc.get("k") is None


def test_entries_over_max_entry_bytes_are_skipped(server) -> None:
    rc = RedisProgramCache(server.url, namespace=f"max{time.time_ns()}", max_entry_bytes=1000)
    with pytest.warns(KernelCacheWarning, match="max_entry_bytes"):
        rc["big"] = b"x" * 1001
    assert rc.get("big") is None


def test_bad_arguments(server) -> None:
    with pytest.raises(ValueError):
        RedisProgramCache(server.url, namespace="")
    with pytest.raises(ValueError):
        RedisProgramCache(server.url, ttl=0)
    with pytest.raises(ValueError):
        RedisProgramCache(server.url, max_entry_bytes=0)
    with pytest.raises(ValueError):
        RedisProgramCache(server.url, secret=b"")
    with pytest.raises(TypeError):
        RedisProgramCache(12345)


def test_accepts_a_ready_client(server) -> None:
    client = redis.Redis.from_url(server.url)
    rc = RedisProgramCache(client, namespace=f"client{time.time_ns()}")
    rc["k"] = b"v"
    assert rc["k"] == b"v"


# -- signing, tampering, read-only --------------------------------------------------------


def test_secret_signs_and_rejects_wrong_or_missing_signatures(server) -> None:
    ns = f"sig{time.time_ns()}"
    writer = RedisProgramCache(server.url, namespace=ns, secret=b"team-secret")
    writer["k"] = b"trusted kernel"
    assert RedisProgramCache(server.url, namespace=ns, secret="team-secret")["k"] == b"trusted kernel"
    wrong = RedisProgramCache(server.url, namespace=ns, secret=b"another")
    with pytest.warns(KernelCacheWarning, match="signed with another secret"):
        assert wrong.get("k") is None
    # A writer without the secret cannot plant code for the secret holders.
    RedisProgramCache(server.url, namespace=ns)["planted"] = b"evil kernel"
    reader = RedisProgramCache(server.url, namespace=ns, secret=b"team-secret")
    with pytest.warns(KernelCacheWarning, match="unsigned"):
        assert reader.get("planted") is None


def test_tampered_entry_is_a_miss(server) -> None:
    ns = f"tamper{time.time_ns()}"
    raw = redis.Redis.from_url(server.url)
    for suffix, secret in (("s", b"s"), ("u", None)):
        rc = RedisProgramCache(server.url, namespace=ns + suffix, secret=secret)
        rc["k"] = b"A" * 100
        (rk,) = list(raw.scan_iter(match=f"{ns}{suffix}:e:*"))
        record = raw.get(rk)
        at = record.index(b"A" * 100) + 50  # a byte inside the payload, not the header
        assert record[at : at + 1] == b"A"
        raw.setrange(rk, at, b"B")
        with pytest.warns(KernelCacheWarning, match="damaged"):
            assert rc.get("k") is None


def test_read_only_never_writes(server) -> None:
    ns = f"ro{time.time_ns()}"
    RedisProgramCache(server.url, namespace=ns)["published"] = b"from CI"
    ro = RedisProgramCache(server.url, namespace=ns, read_only=True)
    assert ro["published"] == b"from CI"
    ro["new"] = b"x"
    assert ro.get("new") is None and len(ro) == 1
    with pytest.raises(PermissionError, match="read_only"):
        ro.clear()
    with pytest.raises(PermissionError):
        del ro["published"]


# -- faults: down, killed and restarted, paused, full ---------------------------------------


def test_redis_down_is_a_miss_warned_once_then_backed_off() -> None:
    from redis_servers import free_port

    rc = RedisProgramCache(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.2, retry_after_s=60)
    with pytest.warns(KernelCacheWarning, match="treated as a miss") as record:
        for _ in range(5):
            assert rc.get("k") is None
            rc["k"] = b"dropped"
    assert len(record) == 1  # the first failure backs off: later calls are skipped, not tried
    s = rc.stats()
    assert s["backing_off"] == 1 and s["misses"] == 5
    assert s["errors"] == 1 and s["skipped_while_down"] == 9  # failures, not skipped calls


def test_compile_succeeds_when_redis_is_down() -> None:
    from cuda.core import ProgramOptions
    from redis_servers import free_port

    dead = RedisProgramCache(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.2)
    info = CompileInfo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = compile_program(TRIVIAL, options=ProgramOptions(arch=ARCH), cache=dead, info=info)
    assert bytes(obj.code)[:4] == b"\x7fELF" and not info.hit


def test_server_killed_during_a_run_and_restarted(tmp_path) -> None:
    need_redis()
    s = RedisServer(str(tmp_path))
    try:
        rc = RedisProgramCache(s.url, socket_timeout=0.3, retry_after_s=0.2)
        rc["k"] = b"before"
        assert rc["k"] == b"before"
        s.kill()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            assert rc.get("k") is None  # a miss, not an exception
            rc["k2"] = b"dropped"
        s.start()  # same port, empty (no persistence)
        time.sleep(0.5)  # past the back-off
        deadline = time.time() + 10
        while rc.get("k3") is None and time.time() < deadline:
            rc["k3"] = b"after"
            time.sleep(0.1)
        assert rc["k3"] == b"after"
    finally:
        s.stop()


def test_paused_server_costs_one_timeout_not_a_hang(tmp_path) -> None:
    need_redis()
    s = RedisServer(str(tmp_path))
    try:
        rc = RedisProgramCache(s.url, socket_timeout=0.3, retry_after_s=0.2)
        rc["k"] = b"v"
        s.pause()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert rc.get("k") is None
        assert any("TimeoutError" in str(c.message) for c in caught)
        s.resume()
        time.sleep(0.4)
        deadline = time.time() + 10
        got = None
        while got is None and time.time() < deadline:
            got = rc.get("k")
            time.sleep(0.05)
        assert got == b"v"
    finally:
        s.stop()


def test_full_server_noeviction_drops_writes_and_keeps_reading(tmp_path) -> None:
    """At maxmemory with noeviction an OOM reply is a dropped write, warned once; reads go on."""
    need_redis()
    s = RedisServer(str(tmp_path), extra=("--maxmemory", "4mb", "--maxmemory-policy", "noeviction"))
    try:
        rc = RedisProgramCache(s.url, socket_timeout=1.0)
        stored = {f"kept{i}": os.urandom(64 * 1024) for i in range(8)}
        rc.update(stored)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(60):
                rc[f"k{i}"] = os.urandom(256 * 1024)
        oom = [c for c in caught if "OutOfMemoryError" in str(c.message)]
        assert len(oom) == 1 and "dropped" in str(oom[0].message)
        assert all(rc.get(k) == v for k, v in stored.items())  # the same store still reads: 8/8
        assert rc.stats()["backing_off"] == 0
        assert 0 < sum(rc.get(f"k{i}") is not None for i in range(60)) < 60
    finally:
        s.stop()


# -- Redis Cluster -----------------------------------------------------------------------------


def test_cluster_round_trip_len_clear(cluster) -> None:
    ns = f"cl{time.time_ns()}"
    rc = RedisProgramCache(cluster.url, namespace=ns, secret=b"s")
    for i in range(50):  # keys spread over all three masters' slots
        rc[f"k{i}"] = f"v{i}".encode()
    assert all(rc[f"k{i}"] == f"v{i}".encode() for i in range(50))
    assert len(rc) == 50
    rc.clear()
    assert len(rc) == 0


def test_cluster_via_client(cluster) -> None:
    from redis.cluster import RedisCluster

    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[1].port)
    rc = RedisProgramCache(client, namespace=f"clc{time.time_ns()}")
    rc["k"] = b"v"
    assert rc["k"] == b"v"


# -- TieredProgramCache ------------------------------------------------------------------------


def test_tiered_reads_promote_and_writes_go_everywhere(tmp_path, server) -> None:
    ns = f"tier{time.time_ns()}"
    host_a = TieredProgramCache(
        [InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "a"), RedisProgramCache(server.url, namespace=ns)]
    )
    host_a.set_record("k", b"artifact", {"log": "w"})
    mem_b, disk_b = InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "b")
    host_b = TieredProgramCache([mem_b, disk_b, RedisProgramCache(server.url, namespace=ns)])
    assert host_b.get_record("k") == (b"artifact", {"log": "w"})  # from Redis
    assert disk_b.get_record("k") == (b"artifact", {"log": "w"})  # promoted to disk
    assert mem_b.get("k") == b"artifact"  # and to memory
    stats = host_b.tier_stats()
    assert stats[2]["hits"] == 1 and stats[0]["misses"] >= 1
    with pytest.raises(ValueError):
        TieredProgramCache([])


def test_compile_through_tiers_second_host_does_not_compile(tmp_path, server) -> None:
    from cuda.core import ProgramOptions

    ns = f"tc{time.time_ns()}"

    def host(name: str) -> TieredProgramCache:
        return TieredProgramCache(
            [
                InMemoryProgramCache(),
                FileStreamProgramCache(tmp_path / name),
                RedisProgramCache(server.url, namespace=ns),
            ]
        )

    a, b = host("a"), host("b")
    i1, i2 = CompileInfo(), CompileInfo()
    o1 = compile_program(TRIVIAL, options=ProgramOptions(arch=ARCH), cache=a, info=i1)
    o2 = compile_program(TRIVIAL, options=ProgramOptions(arch=ARCH), cache=b, info=i2)
    assert (i1.hit, i2.hit) == (False, True) and bytes(o1.code) == bytes(o2.code)
    assert b.stats()["compiles"] == 0


def test_two_hosts_single_flight_through_redis(tmp_path, server) -> None:
    ns = f"sf{time.time_ns()}"
    kernels = 4
    ctx = mp.get_context("spawn")
    gate = str(tmp_path / "gate")  # both start at once, once both have imported
    with ctx.Pool(2) as pool:
        results = pool.starmap(
            w.host_compiles,
            [(str(tmp_path / host), server.url, ns, kernels, gate, 2, ARCH) for host in ("host1", "host2")],
            chunksize=1,
        )
    assert sum(results) == kernels, f"compiles per host: {results}"


def test_dead_redis_lock_holder_expires(tmp_path, server) -> None:
    ns = f"lk{time.time_ns()}"
    rc = RedisProgramCache(server.url, namespace=ns, lock_ttl_s=1)
    ctx = mp.get_context("spawn")
    holder = ctx.Process(target=w.hold_redis_lock_forever, args=(server.url, ns, "name"))
    holder.start()
    deadline = time.time() + 30
    raw = redis.Redis.from_url(server.url)
    while raw.get(f"{ns}:lock:name") is None and time.time() < deadline:
        time.sleep(0.05)
    holder.kill()
    holder.join(10)
    t0 = time.monotonic()
    with rc.remote_lock("name", time.monotonic() + 20, lambda: False) as outcome:
        assert outcome == "acquired"
    assert time.monotonic() - t0 < 15  # released by expiry, not held forever


@pytest.mark.parametrize(
    "kw",
    [
        {"socket_timeout": float("nan")},
        {"socket_timeout": float("inf")},  # "no timeout": every call would raise OverflowError
        {"socket_timeout": 1e12},
        {"retry_after_s": float("nan")},
        {"ttl": float("nan")},
        {"ttl": float("inf")},
        {"ttl": 1e300},  # Redis refuses the PX: every write would be dropped
        {"lock_ttl_s": float("inf")},
    ],
)
def test_numbers_that_cannot_work_raise_at_once(server, kw) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        RedisProgramCache(server.url, **kw)


def test_sub_millisecond_ttl_still_stores(server) -> None:
    # ttl=0.0004 is positive, so it is accepted; as PX 0 Redis refused every write.
    rc = RedisProgramCache(server.url, namespace=f"ttl{time.time_ns()}", ttl=0.0004)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelCacheWarning)
        assert rc.set_record(b"k", b"v") is True


@pytest.mark.parametrize("url_query", [False, True])
def test_a_client_that_decodes_answers_is_refused(server, url_query) -> None:
    # Such a client hands back str: the first hit raised UnicodeDecodeError out of get().
    with pytest.raises(ValueError, match="decode_responses"):
        if url_query:
            RedisProgramCache(server.url + "?decode_responses=True")
        else:
            RedisProgramCache(redis.Redis.from_url(server.url, decode_responses=True))


def test_a_database_that_is_not_a_number_is_refused(server) -> None:
    # redis-py ignores it: "redis://host:port/cache" would silently be database 0.
    with pytest.raises(ValueError, match="'cache'"):
        RedisProgramCache(server.url.rsplit("/", 1)[0] + "/cache")


def test_delete_while_unreachable_raises_oserror_not_keyerror(tmp_path) -> None:
    # The store contract: "could not remove" must never read as "was not there" (KeyError).
    need_redis()
    srv = RedisServer(str(tmp_path))
    try:
        rc = RedisProgramCache(srv.url, socket_timeout=0.3, retry_after_s=0.1)
        disk = FileStreamProgramCache(tmp_path / "disk")
        tiered = TieredProgramCache([disk, rc])
        tiered[b"k"] = b"v"
        srv.pause()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelCacheWarning)
            with pytest.raises(OSError):
                del rc[b"k"]
            with pytest.raises(OSError):  # the disk tier drops it; the caller learns Redis did not
                del tiered[b"k"]
        assert disk.get(b"k") is None
        srv.resume()
        deadline = time.monotonic() + 20
        while not rc.set_record(b"k2", b"v") and time.monotonic() < deadline:  # past the back-off
            time.sleep(0.05)
        with pytest.raises(KeyError):  # reachable again: absent is KeyError, as before
            del rc[b"absent"]
    finally:
        srv.stop()


def test_tiers_without_a_file_tier_make_no_lock_file_in_the_cwd(tmp_path, server, monkeypatch) -> None:
    # TieredProgramCache.lock_path is None without a file tier: its str(), "None", became the
    # one lock file of every key, in whatever the current directory was.
    from cuda.core import ProgramOptions

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    cache = TieredProgramCache([InMemoryProgramCache(), RedisProgramCache(server.url, namespace=f"nf{time.time_ns()}")])
    info = CompileInfo()
    compile_program('extern "C" __global__ void nf(float* x) { x[0] = 1; }', options=ProgramOptions(arch=ARCH), cache=cache)
    compile_program(
        'extern "C" __global__ void nf(float* x) { x[0] = 1; }', options=ProgramOptions(arch=ARCH), cache=cache, info=info
    )
    assert info.hit and os.listdir(cwd) == []
