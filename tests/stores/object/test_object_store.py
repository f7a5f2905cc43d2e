"""ObjectStoreProgramCache against a real S3-protocol server on loopback (moto's server mode).

Faults are real: the server stopped, a proxy in front of it answering 500 to everything or
holding every request, a bucket that does not exist, bytes flipped in the bucket.
"""

from __future__ import annotations

import os
import textwrap
import threading
import warnings

import pytest
from helpers import ARCH, run_python, settle_timestamps
from object_servers import FaultProxy, S3Server, closed_port_endpoint, env_for, iter_objects, need_object_store, set_env

from kernelcache import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    TieredProgramCache,
)

need_object_store()

from kernelcache import ObjectStoreProgramCache  # noqa: E402


@pytest.fixture
def bucket(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    set_env(monkeypatch, s3.endpoint)
    return s3.bucket()


def _store(bucket: str, **kw) -> ObjectStoreProgramCache:
    return ObjectStoreProgramCache(f"s3://{bucket}/team", retry_after_s=kw.pop("retry_after_s", 60), **kw)


def _only_object(s3: S3Server, bucket: str) -> str:
    (key,) = [k for k in iter_objects(s3, bucket) if "/e/" in k]
    return key


# -- the store contract --------------------------------------------------------------------


def test_round_trip_record_len_and_clear(bucket: str) -> None:
    with _store(bucket) as store:
        payload = bytes(range(256)) * 40
        store[b"key"] = payload
        assert store[b"key"] == payload and store.get("key") == payload
        assert store.set_record(b"r", b"cubin", {"symbol_mapping": {"f": "_Z1fv"}})
        assert store.get_record(b"r") == (b"cubin", {"symbol_mapping": {"f": "_Z1fv"}})
        assert store.get(b"absent") is None
        with pytest.raises(KeyError):
            store[b"absent"]
        assert len(store) == 2
        del store[b"key"]
        with pytest.raises(KeyError):
            del store[b"key"]
        store.clear()
        assert len(store) == 0 and store.get(b"r") is None
        assert store.stats()["hits"] == 3 and store.stats()["stores"] == 2


def test_records_are_created_only_if_absent(bucket: str) -> None:
    first, second = _store(bucket), _store(bucket)
    first[b"k"] = b"written first"
    second[b"k"] = b"written second"  # another host, the same key: kept as it was
    assert second[b"k"] == b"written first"
    assert second.stats()["stores"] == 0


def test_read_only_writes_and_deletes_nothing(s3: S3Server, bucket: str) -> None:
    _store(bucket)[b"there"] = b"x"
    reader = _store(bucket, read_only=True)
    reader[b"new"] = b"y"
    assert reader.get(b"new") is None and reader[b"there"] == b"x"
    with pytest.raises(PermissionError):
        del reader[b"there"]
    with pytest.raises(PermissionError):
        reader.clear()
    assert len(list(iter_objects(s3, bucket))) == 1


def test_get_many_keeps_order_and_counts_each(bucket: str) -> None:
    store = _store(bucket)
    for i in range(5):
        store[f"k{i}"] = f"v{i}".encode()
    got = store.get_many(["k3", "nope", "k0", "k4"])
    assert [r and r[0] for r in got] == [b"v3", None, b"v0", b"v4"]
    assert store.stats()["hits"] == 3 and store.stats()["misses"] == 1


def test_get_many_sends_its_gets_at_once(s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = FaultProxy(s3.endpoint)
    set_env(monkeypatch, proxy.endpoint)
    store = _store(bucket, slow_request_s=10)  # the proxy holds each GET until all are sent
    keys = [f"g{i}".encode() for i in range(8)]
    for k in keys:
        store[k] = k
    proxy.hold_gets(8)
    try:
        got = TieredProgramCache([InMemoryProgramCache(), store]).get_many(keys)
    finally:
        proxy.stop()
    assert [r and r[0] for r in got] == keys
    assert proxy.max_gets_in_flight == 8  # one round trip, not eight


# -- trust: tampered and foreign records ---------------------------------------------------


def test_a_tampered_record_is_a_miss_left_in_place_then_replaced(s3: S3Server, bucket: str) -> None:
    store = _store(bucket)
    store.set_record(b"k", b"good cubin", {"symbol_mapping": {"f": "_Z1fv"}})
    name = _only_object(s3, bucket)
    raw = bytearray(s3.client().get_object(Bucket=bucket, Key=name)["Body"].read())
    raw[raw.index(b"_Z1fv")] ^= 0x01  # the metadata that picks the kernel, not the payload
    s3.client().put_object(Bucket=bucket, Key=name, Body=bytes(raw))
    reader = _store(bucket, read_only=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert reader.get_record(b"k") is None
        assert reader.get_record(b"k") is None
    assert len([w for w in caught if issubclass(w.category, KernelCacheWarning)]) == 1
    assert reader.stats()["errors_by_cause"] == {"corrupt": 2}  # warned once, counted each time
    reader.set_record(b"k", b"good cubin", {"symbol_mapping": {"f": "_Z1fv"}})
    assert bytes(raw) == s3.client().get_object(Bucket=bucket, Key=name)["Body"].read()  # read_only: untouched
    writer = _store(bucket)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert writer.set_record(b"k", b"good cubin", {"symbol_mapping": {"f": "_Z1fv"}})
    assert writer.get_record(b"k") == (b"good cubin", {"symbol_mapping": {"f": "_Z1fv"}})


def test_a_record_signed_with_another_secret_is_never_replaced(s3: S3Server, bucket: str) -> None:
    _store(bucket, secret="fleet")[b"k"] = b"signed"
    before = s3.client().get_object(Bucket=bucket, Key=_only_object(s3, bucket))["Body"].read()
    other = _store(bucket, secret="other")
    with pytest.warns(KernelCacheWarning, match="DOES NOT MATCH"):
        assert other.get(b"k") is None
    other[b"k"] = b"mine"
    unsigned = _store(bucket)
    assert unsigned.get(b"k") is None
    assert other.stats()["errors_by_cause"] == {"unverifiable": 2}  # the look-up, then the write's check
    assert unsigned.stats()["errors_by_cause"] == {"unverifiable": 1}
    assert s3.client().get_object(Bucket=bucket, Key=_only_object(s3, bucket))["Body"].read() == before
    assert _store(bucket, secret="fleet")[b"k"] == b"signed"


# -- faults --------------------------------------------------------------------------------


def _warnings_of(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]


def test_500_on_every_request_is_a_miss_one_warning_then_a_back_off(
    s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = FaultProxy(s3.endpoint)
    set_env(monkeypatch, proxy.endpoint)
    try:
        store = _store(bucket)
        store[b"k"] = b"v"
        proxy.mode = "fail"
        sent = proxy.count()

        def calls() -> None:
            for _ in range(5):
                assert store.get(b"k") is None
            store[b"other"] = b"dropped"

        messages = _warnings_of(calls)
        assert len(messages) == 1 and "skipped for 60 s" in messages[0]
        assert proxy.count() - sent == 2  # one call (and obstore's one retry); the rest skipped
        assert store.stats()["backing_off"] == 1 and store.stats()["skipped_while_down"] == 5
        assert store.stats()["errors_by_cause"] == {"unreachable": 1}
    finally:
        proxy.stop()


def test_a_slow_server_costs_one_bounded_timeout(s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = FaultProxy(s3.endpoint, stall_s=30)
    set_env(monkeypatch, proxy.endpoint)
    try:
        store = _store(bucket, client_options={"timeout": "1s", "connect_timeout": "1s"})
        proxy.mode = "stall"
        messages = _warnings_of(lambda: [store.get(b"k") for _ in range(4)])
        assert len(messages) == 1 and "skipped" in messages[0]
        assert proxy.count() == 2  # the first look-up and its one retry, each cut at 1 s
    finally:
        proxy.stop()


def test_a_server_stopped_mid_run_never_fails_a_compile(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from cuda.core import ProgramOptions

    from kernelcache import CompileInfo, compile_program

    server = S3Server()
    set_env(monkeypatch, server.endpoint)
    bucket = server.bucket()
    cache = TieredProgramCache([InMemoryProgramCache(), _store(bucket)])
    src = "__global__ void k%d(float* x) { x[0] = %d; }"
    compile_program(src % (0, 0), options=ProgramOptions(arch=ARCH), cache=cache)
    server.stop()
    infos = [CompileInfo() for _ in range(3)]

    def compiles() -> None:
        for i, info in enumerate(infos, start=1):
            compile_program(src % (i, i), options=ProgramOptions(arch=ARCH), cache=cache, info=info)

    messages = _warnings_of(compiles)
    assert [info.hit for info in infos] == [False, False, False]
    assert len(messages) == 1 and "failed to read" in messages[0]


def test_a_missing_bucket_drops_writes_with_one_warning(bucket: str) -> None:
    store = ObjectStoreProgramCache(f"s3://{bucket}-missing/x")

    def calls() -> None:
        assert store.get(b"k") is None
        store[b"k"] = b"v"
        store[b"j"] = b"v"

    messages = _warnings_of(calls)
    assert len(messages) == 1 and "does not exist" in messages[0]
    assert store.stats()["errors_by_cause"] == {"refused": 3}  # the read and the two writes


def test_a_refused_connection_is_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, closed_port_endpoint())
    store = ObjectStoreProgramCache("s3://nowhere/x")
    messages = _warnings_of(lambda: [store.get(b"k") for _ in range(3)])
    assert len(messages) == 1 and store.stats()["errors"] == 1
    assert store.stats()["errors_by_cause"] == {"unreachable": 1}


@pytest.mark.parametrize("bad", ["bucket/x", "s3://", "ftp://h/x", "http://h/x"])
def test_bad_urls_raise_at_once(bad: str) -> None:
    with pytest.raises(ValueError, match="s3://bucket/path"):
        ObjectStoreProgramCache(bad)


# -- the default cache and two hosts --------------------------------------------------------


def test_the_default_cache_puts_the_object_store_after_redis(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelcache import default_cache
    from kernelcache.stores.redis.store import RedisProgramCache

    monkeypatch.setenv("KERNELCACHE_OBJECT_STORE_URL", f"s3://{bucket}/d")
    monkeypatch.setenv("KERNELCACHE_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("KERNELCACHE_OBJECT_STORE_READ_ONLY", "1")
    tiers = default_cache().tiers
    assert [type(t) for t in tiers] == [
        InMemoryProgramCache,
        FileStreamProgramCache,
        RedisProgramCache,
        ObjectStoreProgramCache,
    ]
    assert tiers[-1].read_only


_HOST = textwrap.dedent(
    """
    import sys
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, compile_program
    compiled = 0
    for i in range(int(sys.argv[1])):
        info = CompileInfo()
        src = '#include "h.cuh"\\n__global__ void k%d(float* x) { x[0] = H + %d; }' % (i, i)
        compile_program(src, options=ProgramOptions(arch=sys.argv[2], include_path=[sys.argv[3]]), info=info)
        compiled += not info.hit
    print(compiled)
    """
)


def test_two_hosts_sharing_only_the_bucket_compile_each_key_once(s3: S3Server, bucket: str, tmp_path) -> None:
    headers = tmp_path / "inc"
    headers.mkdir()
    (headers / "h.cuh").write_text("#define H 1\n")
    settle_timestamps()
    keys = 6
    results: list[str] = []

    def host(name: str) -> None:
        env = {**env_for(s3.endpoint), "KERNELCACHE_DIR": str(tmp_path / name)}
        env["KERNELCACHE_OBJECT_STORE_URL"] = f"s3://{bucket}/fleet"
        results.append(run_python(_HOST, str(keys), ARCH, str(headers), env=env).strip())

    hosts = [threading.Thread(target=host, args=(n,)) for n in ("host-a", "host-b")]
    for h in hosts:
        h.start()
    for h in hosts:
        h.join()
    assert len(results) == 2 and sum(int(r) for r in results) == keys, results
    # Each host's disk holds every entry and manifest (a compiling host also its source index):
    # hits were copied into its disk tier.
    assert all(len(FileStreamProgramCache(tmp_path / h)) >= 2 * keys for h in ("host-a", "host-b"))


_READ_CPP = textwrap.dedent(
    """
    import sys
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, compile_program
    info = CompileInfo()
    src = '#include "h.cuh"\\n__global__ void k(float* x) { x[0] = H; }'
    compile_program(src, options=ProgramOptions(arch=sys.argv[1], include_path=[sys.argv[2]]), info=info)
    print(info.hit)
    """
)


def test_a_cpp_hit_from_the_bucket_is_one_get_per_level_and_writes_nothing_back(
    s3: S3Server, bucket: str, tmp_path
) -> None:
    headers = tmp_path / "inc"
    headers.mkdir()
    (headers / "h.cuh").write_text("#define H 2\n")
    settle_timestamps()
    env = {**env_for(s3.endpoint), "KERNELCACHE_OBJECT_STORE_URL": f"s3://{bucket}/fleet"}
    assert run_python(_READ_CPP, ARCH, str(headers), env={**env, "KERNELCACHE_DIR": str(tmp_path / "a")}) == "False\n"
    proxy = FaultProxy(s3.endpoint)
    try:
        env_b = {**env, "AWS_ENDPOINT_URL": proxy.endpoint, "KERNELCACHE_DIR": str(tmp_path / "b")}
        assert run_python(_READ_CPP, ARCH, str(headers), env=env_b) == "True\n"
    finally:
        proxy.stop()
    # the manifest, the header variant it names, then the entry; no write
    assert proxy.count("GET") == 3 and proxy.count() == 3
    assert len(FileStreamProgramCache(tmp_path / "b")) == 3  # all copied into the disk tier


def test_ls_and_stats_read_a_bucket(s3: S3Server, bucket: str) -> None:
    import json
    import subprocess
    import sys

    store = _store(bucket)
    store.set_record(b"a", b"\x7fELF" + bytes(60), {"code_type": "c++", "target_type": "cubin", "kernels": ["k"]})
    store.set_record(b"m", b"{}", {"kind": "manifest"})  # bookkeeping: not listed
    env = {**os.environ, **env_for(s3.endpoint)}
    url = f"s3://{bucket}/team"
    ls = subprocess.run(
        [sys.executable, "-m", "kernelcache", "ls", "--object-store", url, "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert ls.returncode == 0, ls.stderr
    (row,) = json.loads(ls.stdout)
    assert (row["code_type"], row["target_type"], row["kernels"]) == ("c++", "cubin", ["k"])
    stats = subprocess.run(
        [sys.executable, "-m", "kernelcache", "stats", "--object-store", url, "--json"],
        env={**env, "KERNELCACHE_DIR": "/nonexistent/kc"},
        capture_output=True,
        text=True,
    )
    assert stats.returncode == 0, stats.stderr
    held = json.loads(stats.stdout)["object"]
    assert (held["entries"], held["records"]) == (1, 2)  # kernels as ls lists them; every record


def test_bundle_create_from_a_bucket_and_import_into_another(s3: S3Server, bucket: str, tmp_path) -> None:
    import subprocess
    import sys

    _store(bucket).set_record(b"k1", b"cubin one", {"symbol_mapping": {"f": "_Z1fv"}})
    _store(bucket).set_record(b"k2", b"cubin two", {})
    env = {**os.environ, **env_for(s3.endpoint)}
    out = str(tmp_path / "fleet.kcb")

    def kc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "kernelcache", *args], env=env, capture_output=True, text=True)

    made = kc("bundle", "create", out, "--object-store", f"s3://{bucket}/team")
    assert made.returncode == 0 and "2 kernels (2 records" in made.stdout, made.stderr
    other = s3.bucket()
    loaded = kc("import", out, "--object-store", f"s3://{other}/team")
    assert loaded.returncode == 0 and "imported 2 kernels (2 records)" in loaded.stdout, loaded.stderr
    assert _store(other).get_record(b"k1") == (b"cubin one", {"symbol_mapping": {"f": "_Z1fv"}})
    assert _store(other)[b"k2"] == b"cubin two"
    both = kc("import", out, "--object-store", f"s3://{other}/team", "--redis", "redis://127.0.0.1:1/0")
    assert both.returncode == 2 and "give one of" in both.stderr


def test_an_expired_lock_is_taken_over_by_exactly_one_waiter(s3: S3Server, bucket: str) -> None:
    import json
    import time

    # A lock left by a holder that died (its expiry passed): waiters race to replace it.
    body = json.dumps({"token": "dead-holder", "expires": time.time() - 5}).encode()
    s3.client().put_object(Bucket=bucket, Key="team/kernelcache/locks/k", Body=body)
    outcomes: list[str] = []
    gate = threading.Barrier(6)
    told = threading.Condition()

    def waiter() -> None:
        store = _store(bucket, lock_ttl_s=30)
        gate.wait()
        with store.remote_lock("k", time.monotonic() + 2, lambda: False) as outcome, told:
            outcomes.append(outcome)
            told.notify_all()
            if outcome == "acquired":  # held until every other waiter's deadline has passed
                told.wait_for(lambda: len(outcomes) == 6, timeout=60)

    threads = [threading.Thread(target=waiter) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["acquired"] + ["timeout"] * 5


def test_a_holder_killed_mid_compile_is_taken_over_after_its_ttl(s3: S3Server, bucket: str) -> None:
    import signal
    import subprocess
    import sys
    import time

    code = textwrap.dedent(
        f"""
        import time
        from kernelcache import ObjectStoreProgramCache
        store = ObjectStoreProgramCache("s3://{bucket}/team", lock_ttl_s=1)
        with store.remote_lock("k", time.monotonic() + 5, lambda: False) as outcome:
            print(outcome, flush=True)
            time.sleep(60)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert holder.stdout is not None and holder.stdout.readline().strip() == "acquired"
    store = _store(bucket, lock_ttl_s=1)
    with store.remote_lock("k", time.monotonic() + 0.5, lambda: False) as outcome:
        assert outcome == "timeout"  # alive and refreshing: not taken
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with store.remote_lock("k", time.monotonic() + 30, lambda: False) as outcome:
        assert outcome == "acquired"  # once its expiry passed
