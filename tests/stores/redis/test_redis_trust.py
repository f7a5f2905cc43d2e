"""Who may read, write and delete what in a shared Redis.

Real redis-server, real clients with and without the team's secret; the entries are looked
at with a raw redis client, never through the code under test.
"""

from __future__ import annotations

import threading
import time
import warnings

import pytest

from kernelcache import KernelCacheWarning
from kernelcache.stores.naming import entry_name

redis = pytest.importorskip("redis", reason="the redis client is the 'redis' extra: pip install -e '.[dev]'")
from kernelcache import RedisProgramCache  # noqa: E402 - needs the redis client checked above


@pytest.fixture
def raw(server):
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


@pytest.fixture
def ns() -> str:
    return f"trust{time.time_ns()}"


def rkey(ns: str, key: str) -> str:
    return f"{ns}:e:{entry_name(key.encode())}"


def everything(raw, ns: str) -> dict[bytes, bytes]:
    """Every key of the test's namespace with its serialized value (any type): a full picture.

    Race: the server is the module's, and an earlier test's store that was never closed
    sends its counts (to its own namespace) from the process's counter thread about once a
    second, at any moment of a later test: a picture of the whole database would see them."""
    return {k: raw.dump(k) for k in raw.scan_iter(match=f"{ns}:*", count=1000)}


# -- a client without the team's secret --------------------------------------------------------


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("their_secret", [None, b"another secret"])
def test_reader_without_the_teams_secret_never_deletes_signed_entries(server, raw, ns, read_only, their_secret):
    team = RedisProgramCache(server.url, namespace=ns, secret=b"team secret")
    team.set_record("k", b"signed kernel", {"symbols": [["s", "f<int>", "b", "_Z1fIiEvv"]]})
    before = raw.get(rkey(ns, "k"))
    outsider = RedisProgramCache(server.url, namespace=ns, secret=their_secret, read_only=read_only)
    with pytest.warns(KernelCacheWarning, match="signed"):
        for _ in range(3):
            assert outsider.get("k") is None
            assert outsider.get_record("k") is None
    assert raw.get(rkey(ns, "k")) == before  # still there, byte for byte
    assert team.get_record("k") == (b"signed kernel", {"symbols": [["s", "f<int>", "b", "_Z1fIiEvv"]]})


def test_host_with_another_secret_never_overwrites_and_says_so_once(server, raw, ns):
    team = RedisProgramCache(server.url, namespace=ns, secret=b"team secret")
    team["k"] = b"the fleet's kernel"
    before = raw.get(rkey(ns, "k"))
    stray = RedisProgramCache(server.url, namespace=ns, secret=b"a stale secret")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):  # a miss, then the compile's store: on every call
            assert stray.get("k") is None
            stray["k"] = b"the stray host's kernel"
    loud = [c for c in caught if "DOES NOT MATCH THE FLEET'S" in str(c.message)]
    assert len(loud) == 1 and len(caught) == 1
    assert raw.get(rkey(ns, "k")) == before
    assert team["k"] == b"the fleet's kernel"
    unsigned = RedisProgramCache(server.url, namespace=ns)  # no secret at all: same rule
    with pytest.warns(KernelCacheWarning, match="no secret"):
        unsigned["k"] = b"unsigned kernel"
    assert raw.get(rkey(ns, "k")) == before


def test_signed_writer_replaces_an_unsigned_entry(server, raw, ns):
    RedisProgramCache(server.url, namespace=ns)["k"] = b"planted, unsigned"
    team = RedisProgramCache(server.url, namespace=ns, secret=b"team secret")
    with pytest.warns(KernelCacheWarning, match="unsigned"):
        assert team.get("k") is None  # never trusted
    team["k"] = b"the fleet's kernel"
    assert team["k"] == b"the fleet's kernel"


def test_unknown_future_format_is_a_miss_never_deleted_or_overwritten(server, raw, ns):
    future = b"KCR9" + b"\x00" * 40 + b"a record of a later kernelcache"
    raw.set(rkey(ns, "k"), future)
    for read_only in (True, False):
        rc = RedisProgramCache(server.url, namespace=ns, read_only=read_only)
        with pytest.warns(KernelCacheWarning, match="format this version does not know"):
            assert rc.get("k") is None
            rc["k"] = b"an older host's kernel"
    assert raw.get(rkey(ns, "k")) == future


def test_previous_format_is_a_quiet_miss_then_replaced(server, raw, ns):
    raw.set(rkey(ns, "k"), b"KCR1\x02\x00\x00\x00{}old")
    rc = RedisProgramCache(server.url, namespace=ns)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not an error, not even a warning
        assert rc.get("k") is None
        rc["k"] = b"new"
    assert rc["k"] == b"new"


# -- read_only touches nothing ------------------------------------------------------------------


def test_read_only_writes_and_deletes_nothing_counters_included(server, raw, ns):
    writer = RedisProgramCache(server.url, namespace=ns)
    writer["good"] = b"G" * 64
    writer["damaged"] = b"D" * 64
    record = raw.get(rkey(ns, "damaged"))
    raw.setrange(rkey(ns, "damaged"), record.index(b"D" * 64) + 3, b"X")  # inside the payload
    writer.close()
    before = everything(raw, ns)
    ro = RedisProgramCache(server.url, namespace=ns, read_only=True)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for _ in range(50):
            assert ro["good"] == b"G" * 64
            assert ro.get("damaged") is None  # provably damaged, yet a read_only store keeps it
            assert ro.get("absent") is None
        ro["new"] = b"x"
        ro.add_stats(compiles=3, compile_us_saved=1000)
        with ro.remote_lock("name", time.monotonic() + 1, lambda: False) as outcome:
            assert outcome == "unavailable"
        ro.close()
    assert everything(raw, ns) == before


def test_provable_damage_is_removed_by_a_writer(server, raw, ns):
    rc = RedisProgramCache(server.url, namespace=ns, secret=b"s")
    rc.set_record("k", b"P" * 64, {"symbols": [["s", "k<float>", "b", "_Z1kIfEvv"]]})
    record = raw.get(rkey(ns, "k"))
    raw.setrange(rkey(ns, "k"), record.index(b"P" * 64) + 10, b"Q")
    with pytest.warns(KernelCacheWarning, match="damaged.*removed"):
        assert rc.get("k") is None
    assert raw.get(rkey(ns, "k")) is None


@pytest.mark.parametrize("secret", [None, b"s"])
def test_metadata_is_covered_by_the_check(server, raw, ns, secret):
    """A flipped bit in the metadata (which chooses the kernel) is a miss, signed or not."""
    rc = RedisProgramCache(server.url, namespace=ns, secret=secret)
    rc.set_record("k", b"cubin", {"symbols": [["s", "axpy<float>", "b", "_Z4axpyIfEvv"]]})
    record = raw.get(rkey(ns, "k"))
    at = record.index(b"_Z4axpyIfEvv") + 8
    assert record[at : at + 1] == b"f"
    raw.setrange(rkey(ns, "k"), at, b"d")  # axpy<float> -> the mangled name of axpy<double>
    with pytest.warns(KernelCacheWarning, match="damaged"):
        assert rc.get_record("k") is None
    # Truncated after the payload: no longer a permanent hit with half a record.
    rc.set_record("t", b"cubin", {"symbols": [["s", "axpy<float>", "b", "_Z4axpyIfEvv"]]})
    raw.set(rkey(ns, "t"), raw.get(rkey(ns, "t"))[:-40])
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert rc.get_record("t") is None


def test_removing_damage_never_deletes_a_good_record_written_meanwhile(server, raw, ns):
    """Race: a reader judges a value damaged, a writer replaces it with a good record, then
    the reader deletes. The delete must only remove the value it judged."""
    rc = RedisProgramCache(server.url, namespace=ns)
    rc["k"] = b"V" * 256
    good = raw.get(rkey(ns, "k"))
    bad = bytearray(good)
    bad[good.index(b"V" * 256) + 5] ^= 1
    stop = threading.Event()

    def reader() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            while not stop.is_set():
                rc.get("k")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    lost = 0
    hammer = redis.Redis.from_url(server.url)
    try:
        for _ in range(1500):
            hammer.set(rkey(ns, "k"), bytes(bad))
            hammer.set(rkey(ns, "k"), good)
            if hammer.get(rkey(ns, "k")) != good:  # only the readers delete, and only damage
                lost += 1
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert lost == 0


# -- namespaces are literal ----------------------------------------------------------------------


@pytest.mark.parametrize("glob", ["ml*{tag}", "ml?team{tag}", "m[l]-team{tag}", "ml\\-team{tag}", "*{tag}"])
def test_namespace_glob_characters_are_literal(server, glob):
    tag = str(time.time_ns())
    team = RedisProgramCache(server.url, namespace=f"ml-team{tag}")  # every glob above matches it
    team["k"] = b"keep me"
    neighbour = RedisProgramCache(server.url, namespace=glob.format(tag=tag))
    neighbour["own"] = b"mine"
    assert len(neighbour) == 1
    neighbour.clear()
    assert len(neighbour) == 0
    assert team["k"] == b"keep me" and len(team) == 1


def test_namespace_that_extends_another_is_not_touched(server):
    tag = str(time.time_ns())
    inner = RedisProgramCache(server.url, namespace=f"ml{tag}:e:x")  # its keys start with "ml<tag>:e:"
    inner["k"] = b"keep me"
    outer = RedisProgramCache(server.url, namespace=f"ml{tag}")
    outer["own"] = b"mine"
    assert len(outer) == 1
    outer.clear()
    assert inner["k"] == b"keep me" and len(inner) == 1


def test_namespace_star_clear_spares_ml_team(server):
    team = RedisProgramCache(server.url, namespace="ml-team")
    team["k"] = b"keep me"
    try:
        star = RedisProgramCache(server.url, namespace="ml*")
        star["own"] = b"mine"
        assert len(star) == 1
        star.clear()
        assert team["k"] == b"keep me" and len(team) >= 1
    finally:
        team.clear()


def test_compile_on_a_host_with_a_stale_secret_leaves_the_fleets_entries(server, raw, ns, tmp_path):
    """compile_program's miss path (manifest and entry writes) on a host whose secret is not
    the fleet's: it compiles for itself and leaves every signed record as it was."""
    from cuda.core import ProgramOptions
    from helpers import ARCH

    from kernelcache import CompileInfo, FileStreamProgramCache, TieredProgramCache, compile_program

    src = 'extern "C" __global__ void fill(float* a, float v) { a[threadIdx.x] = v; }\n'
    team = RedisProgramCache(server.url, namespace=ns, secret=b"team secret")
    compile_program(src, options=ProgramOptions(arch=ARCH), cache=team)
    before = everything(raw, ns)
    stray = TieredProgramCache(
        [FileStreamProgramCache(tmp_path), RedisProgramCache(server.url, namespace=ns, secret=b"stale")]
    )
    info = CompileInfo()
    with pytest.warns(KernelCacheWarning, match="DOES NOT MATCH THE FLEET'S"):
        compile_program(src, options=ProgramOptions(arch=ARCH), cache=stray, info=info)
    assert not info.hit
    stray.close()
    def entries(keys: dict) -> dict:  # the fleet counters (``:stats`` and per host ``:stats:host:*``) move
        return {k: v for k, v in keys.items() if not (k.endswith(b":stats") or b":stats:" in k)}

    after = entries(everything(raw, ns))
    assert after == entries(before)
    again = CompileInfo()
    compile_program(src, options=ProgramOptions(arch=ARCH), cache=team, info=again)
    assert again.hit
