"""The ProgramCacheResource contract, for every built-in store, plus each store's own rules."""

from __future__ import annotations

import os
import threading
import time
import warnings

import pytest
from _fswatch import Watch
from helpers import mounted_tmpfs, remount_read_only

from kernelcache import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    ProgramCacheResource,
    TieredProgramCache,
    UnsafeCacheDirError,
)
from kernelcache.stores.file.sidecar import SIDECAR_FORMAT
from kernelcache.stores.file.store import FORMAT_DIR

IN_OPEN = 0x20
IN_Q_OVERFLOW = 0x4000


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path) -> ProgramCacheResource:
    if request.param == "memory":
        return InMemoryProgramCache()
    return FileStreamProgramCache(tmp_path / "cache")


# -- the shared contract -------------------------------------------------------------


def test_round_trip_returns_exact_bytes(store: ProgramCacheResource) -> None:
    payload = bytes(range(256)) * 40
    store[b"key"] = payload
    assert store[b"key"] == payload
    assert store.get(b"key") == payload


def test_str_and_bytes_keys_name_the_same_entry(store: ProgramCacheResource) -> None:
    store["k"] = b"one"
    assert store[b"k"] == b"one"
    store[b"k"] = b"two"
    assert store["k"] == b"two"
    assert len(store) == 1


@pytest.mark.parametrize("bad_key", [1, 1.5, None, bytearray(b"k"), ("k",), object()])
def test_other_key_types_raise_type_error(store: ProgramCacheResource, bad_key: object) -> None:
    with pytest.raises(TypeError, match="keys must be bytes or str"):
        store[bad_key] = b"x"  # type: ignore[index]
    with pytest.raises(TypeError):
        store.get(bad_key)  # type: ignore[arg-type]


def test_value_types(store: ProgramCacheResource) -> None:
    store["a"] = bytearray(b"abc")
    store["b"] = memoryview(b"xyzw")[1:3]
    assert store["a"] == b"abc" and type(store["a"]) is bytes
    assert store["b"] == b"yz"
    with pytest.raises(TypeError, match="cache values"):
        store["c"] = "text is not an artifact"  # type: ignore[assignment]
    with pytest.raises(TypeError):
        store["c"] = 42  # type: ignore[assignment]


def test_missing_key(store: ProgramCacheResource) -> None:
    with pytest.raises(KeyError):
        store["absent"]
    assert store.get("absent") is None
    assert store.get("absent", b"dflt") == b"dflt"
    with pytest.raises(KeyError):
        del store["absent"]


def test_delete_len_clear_update(store: ProgramCacheResource) -> None:
    store.update({"a": b"1", b"b": b"2"})
    store.update([("c", b"3")])
    assert len(store) == 3
    del store["a"]
    assert store.get("a") is None and len(store) == 2
    store.clear()
    assert len(store) == 0 and store.get("b") is None


def test_no_contains(store: ProgramCacheResource) -> None:
    store["a"] = b"1"
    assert not hasattr(type(store), "__contains__")
    with pytest.raises(TypeError):
        "a" in store  # noqa: B015 - iteration fallback must not exist either


def test_context_manager_and_stats(store: ProgramCacheResource) -> None:
    with store as s:
        s["a"] = b"12345"
        s.get("a")
        s.get("nope")
        stats = s.stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["stores"] == 1
    assert stats["bytes_written"] == 5 and stats["bytes_read"] == 5
    assert stats["hit_rate"] == 0.5


def test_records_keep_metadata(store: ProgramCacheResource) -> None:
    store.set_record("k", b"payload", {"log": "warning: x", "symbols": {"f<int>": "_Z1fIiEvv"}})
    payload, meta = store.get_record("k")  # type: ignore[misc]
    assert payload == b"payload"
    assert meta == {"log": "warning: x", "symbols": {"f<int>": "_Z1fIiEvv"}}
    before = store.stats()
    store.get_record("k", internal=True)
    store.get_record("other", internal=True)
    after = store.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])
    assert after["internal_gets"] == before["internal_gets"] + 2


@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_cap_is_rejected(tmp_path, bad: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        InMemoryProgramCache(max_size_bytes=bad)
    with pytest.raises(ValueError, match="positive"):
        FileStreamProgramCache(tmp_path, max_size_bytes=bad)
    with pytest.raises(TypeError):
        InMemoryProgramCache(max_size_bytes="1GB")  # type: ignore[arg-type]


# -- InMemoryProgramCache --------------------------------------------------------------


def test_memory_lru_by_access_and_cap() -> None:
    cache = InMemoryProgramCache(max_size_bytes=30)
    cache["a"] = b"x" * 10
    cache["b"] = b"x" * 10
    cache["c"] = b"x" * 10
    cache.get("a")  # a is now the most recent
    cache["d"] = b"x" * 10  # evicts b, the least recently used
    assert cache.get("b") is None
    assert cache.get("a") is not None and cache.get("c") is not None and cache.get("d") is not None
    assert cache.stats()["evictions"] == 1


def test_memory_entry_larger_than_cap_is_not_stored() -> None:
    cache = InMemoryProgramCache(max_size_bytes=10)
    cache["small"] = b"123"
    with pytest.warns(KernelCacheWarning, match="exceeds max_size_bytes"):
        cache["big"] = b"x" * 11
    assert cache.get("big") is None
    assert cache.get("small") == b"123"  # nothing was evicted for it


def test_file_entry_larger_than_cap_is_not_stored(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=2000)
    cache["small"] = b"123"
    with pytest.warns(KernelCacheWarning, match="exceeds max_size_bytes"):
        cache["big"] = b"x" * 5000
    assert cache.get("big") is None
    assert cache.get("small") == b"123" and cache.stats()["evictions"] == 0


def test_the_too_large_warning_names_what_the_cap_counts(tmp_path) -> None:
    # The disk cap counts an entry with its sidecar: a payload under the cap whose pair is over
    # it is not stored, and the warning says the size that was over, not the payload's.
    import re

    cache = FileStreamProgramCache(tmp_path, max_size_bytes=1100)
    with pytest.warns(KernelCacheWarning, match="exceeds max_size_bytes") as caught:
        cache["big"] = b"x" * 1000
    assert cache.get("big") is None
    message = str(caught[0].message)
    shown = int(re.search(r"of (\d+) bytes", message).group(1))
    assert shown > 1100 and "with its metadata" in message, message


def test_memory_threads() -> None:
    cache = InMemoryProgramCache(max_size_bytes=64 * 100)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(2000):
                key = f"{n}-{i % 150}"
                cache[key] = key.encode() * 4
                got = cache.get(key)
                assert got is None or got == key.encode() * 4
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert cache.stats()["size_bytes"] <= 64 * 100


# -- FileStreamProgramCache: layout and integrity ------------------------------------


def _entry_files(root) -> list[str]:
    out = []
    for dirpath, _, files in os.walk(os.path.join(root, FORMAT_DIR, "entries")):
        out += [os.path.join(dirpath, f) for f in files if not f.endswith(".meta")]
    return sorted(out)


def test_layout_and_verbatim_entries(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path / "c")
    cache[b"k"] = b"\x7fELF-verbatim"
    (entry,) = _entry_files(tmp_path / "c")
    name = os.path.basename(entry)
    assert len(name) == 64 and os.path.basename(os.path.dirname(entry)) == name[:2]
    with open(entry, "rb") as f:
        assert f.read() == b"\x7fELF-verbatim"  # raw bytes: no header, no pickle
    assert os.path.exists(entry + ".meta")
    for sub in ("tmp", "locks", "stats"):
        assert os.path.exists(tmp_path / "c" / FORMAT_DIR / sub)
    assert (os.stat(tmp_path / "c").st_mode & 0o777) == 0o700


def test_default_path_honours_env(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "env-root"))
    cache = FileStreamProgramCache()
    assert cache.path == str(tmp_path / "env-root")
    cache["a"] = b"1"
    assert _entry_files(tmp_path / "env-root")


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend", "no-sidecar", "bad-sidecar"])
def test_corrupt_entry_is_a_miss_removed_with_one_warning(tmp_path, damage: str) -> None:
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"A" * 1000
    time.sleep(0.1)  # past the racy window (kernelcache.timestamps): the pair read next is kept in memory
    cache.get("k")  # remember the verified sidecar (and the pair): damage must still be caught
    (entry,) = _entry_files(tmp_path)
    if damage == "flip":
        with open(entry, "r+b") as f:
            f.seek(500)
            f.write(b"B")
    elif damage == "truncate":
        os.truncate(entry, 10)
    elif damage == "extend":
        with open(entry, "ab") as f:
            f.write(b"junk")
    elif damage == "no-sidecar":
        os.unlink(entry + ".meta")
    else:
        with open(entry + ".meta", "wb") as f:
            f.write(b"garbage")
    if damage in ("no-sidecar", "bad-sidecar"):
        # The entry file is untouched: this store serves the pair it verified from memory
        # (stores/file/payloads.py); a reader that has not verified it judges the damage.
        assert cache.get("k") == b"A" * 1000
        cache = FileStreamProgramCache(tmp_path)
    with pytest.warns(KernelCacheWarning, match="integrity check") as record:
        assert cache.get("k") is None
        assert cache.get("k") is None
    assert len(record) == 1  # one warning per cause, however often it happens
    assert not os.path.exists(entry)
    stats = cache.stats()
    assert stats["errors"] >= 1 and stats["misses"] == 2
    cache["k"] = b"A" * 1000  # and the key works again
    assert cache["k"] == b"A" * 1000


def test_unknown_sidecar_format_is_skipped_not_deleted(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"data"
    (entry,) = _entry_files(tmp_path)
    with open(entry + ".meta", "rb") as f:
        raw = f.read()
    with open(entry + ".meta", "wb") as f:
        f.write(raw.replace(b"kernelcache-sidecar %d " % SIDECAR_FORMAT, b"kernelcache-sidecar 99 ", 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get("k") is None
    assert os.path.exists(entry)


def test_unsafe_root_is_refused_unless_allowed(tmp_path) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o2770)  # a team cache: group-writable, setgid
    with pytest.raises(UnsafeCacheDirError, match="allow_shared=True"):
        FileStreamProgramCache(root)
    FileStreamProgramCache(root, allow_shared=True)["a"] = b"1"
    os.chmod(root, 0o777)  # writable by others: neither mode accepts it
    for shared in (False, True):
        with pytest.raises(UnsafeCacheDirError, match="writable by others"):
            FileStreamProgramCache(root, allow_shared=shared)
    other = tmp_path / "other-owner"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    with pytest.raises(UnsafeCacheDirError, match="owned by uid 12345"):
        FileStreamProgramCache(other)


def test_bad_path_type(tmp_path) -> None:
    with pytest.raises(TypeError):
        FileStreamProgramCache(123)  # type: ignore[arg-type]


def test_stale_tmp_swept_fresh_kept_and_tmp_recreated(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    tmp = tmp_path / FORMAT_DIR / "tmp"
    stale, fresh = tmp / "dead.tmp", tmp / "live.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - 3 * 3600
    os.utime(stale, (old, old))
    import fcntl

    # A live writer holds its staged file's flock (fileops.stage_held); an old one is
    # kept too while held, and a fresh one that nobody holds is a dead writer's.
    held = tmp / "held.tmp"
    held.write_bytes(b"z")
    os.utime(held, (old, old))
    with open(held, "rb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)
        FileStreamProgramCache(tmp_path)  # opening sweeps
        assert held.exists()
    assert not stale.exists() and not fresh.exists()
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()  # deleted under a live cache
    cache["k"] = b"still works"
    assert cache["k"] == b"still works"


# -- FileStreamProgramCache: LRU and the size cap ------------------------------------


def test_lru_by_last_read(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=4000)
    for name in "abc":
        cache[name] = name.encode() * 1000
        time.sleep(0.01)
    cache.get("a")  # a becomes the most recently read
    cache["d"] = b"d" * 1000  # over the cap: the least recently read (b) goes first
    assert cache.get("b") is None
    assert cache.get("a") == b"a" * 1000
    assert cache.get("d") == b"d" * 1000
    assert cache.stats()["evictions"] >= 1


def test_size_tracker_is_exact_and_reconciles(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=10**9)
    for i in range(20):
        cache[str(i)] = b"x" * (100 + i)
    tracked = cache.stats()["size_bytes"]
    on_disk = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / FORMAT_DIR / "entries") for f in fs
    )
    assert tracked == on_disk
    del cache["3"]
    cache["4"] = b"short"  # a rewrite moves the tracker by the net delta
    cache["new"] = b"n" * 77
    tracked = cache.stats()["size_bytes"]  # read before any rescan: the net accounting itself
    on_disk = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / FORMAT_DIR / "entries") for f in fs
    )
    assert tracked == on_disk
    assert cache._sizecap.reconcile() == on_disk  # and a rescan agrees


def test_full_cache_write_does_not_rescan_every_time(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=200 * 300)
    # Every directory scan opens entries/ itself (os.scandir): count those opens as the
    # kernel reports them, whichever function scans (nothing else opens that directory).
    watch = Watch()
    watch.add(str(tmp_path / FORMAT_DIR / "entries"), IN_OPEN)
    scans = 0
    try:
        for i in range(1000):
            cache[str(i)] = b"x" * 200
            if i % 20 == 0:  # drain often: the kernel's event queue is bounded
                scans += sum(1 for _, mask, name in watch.events(0) if not name and not mask & IN_Q_OVERFLOW)
        scans += sum(1 for _, mask, name in watch.events(0.1) if not name and not mask & IN_Q_OVERFLOW)
    finally:
        watch.close()
    # Evicting to the low-water mark leaves room for ~10% of the cap before the next
    # pass, and passes reuse the scan's candidate list: a handful of scans, not 800.
    assert 1 <= scans <= 1000 * 300 / (200 * 300) * 2 + 5
    assert cache.stats()["size_bytes"] <= 200 * 300


def test_temp_files_of_writers_do_not_evict_committed_entries(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=10_000)
    cache["keep"] = b"k" * 2000
    tmp = tmp_path / FORMAT_DIR / "tmp"
    for i in range(50):  # a burst of in-flight writes of other processes
        (tmp / f"inflight-{i}.tmp").write_bytes(b"t" * 5000)
    cache["other"] = b"o" * 100
    assert cache.get("keep") == b"k" * 2000
    assert cache.stats()["evictions"] == 0


def test_stat_guard_spares_an_entry_rewritten_after_the_scan(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=3000)
    cache["a"] = b"a" * 1000
    cache["b"] = b"b" * 1000
    cache._sizecap.reconcile()  # candidates now hold a's and b's current versions
    time.sleep(0.01)
    cache["a"] = b"A" * 1000  # a is rewritten: a new inode, not the version the scan saw
    cache["c"] = b"c" * 900  # over the cap: evicts from the candidate list, oldest first
    assert cache.get("a") == b"A" * 1000
    assert cache.get("b") is None


# -- FileStreamProgramCache: real full and read-only filesystems ---------------------


def test_full_disk_drops_write_with_one_warning(tmp_path) -> None:
    with mounted_tmpfs("256k") as point:
        cache = FileStreamProgramCache(point)
        cache["small"] = b"s" * 1000
        with pytest.warns(KernelCacheWarning, match="not stored") as record:
            cache["huge1"] = os.urandom(600 * 1024)
            cache["huge2"] = os.urandom(600 * 1024)
        assert len(record) == 1
        assert cache.get("huge1") is None and cache.get("small") == b"s" * 1000
        assert cache.stats()["errors"] >= 2
        assert not os.listdir(os.path.join(point, FORMAT_DIR, "tmp"))  # no debris left


def test_read_only_filesystem_reads_work_writes_dropped(tmp_path) -> None:
    with mounted_tmpfs("1m") as point:
        with FileStreamProgramCache(point) as writer:
            writer["k"] = b"kept"
        remount_read_only(point)
        cache = FileStreamProgramCache(point)
        assert cache["k"] == b"kept"
        with pytest.warns(KernelCacheWarning, match="not stored"):
            cache["new"] = b"x"
        assert cache.get("new") is None


# -- cuda.core interoperability: ObjectCode values ------------------------------------


def test_object_code_values_memory_and_path_backed(tmp_path, store: ProgramCacheResource) -> None:
    from cuda.core import ObjectCode

    store["mem"] = ObjectCode.from_cubin(b"\x7fELF-in-memory")
    assert store["mem"] == b"\x7fELF-in-memory"
    path = tmp_path / "k.cubin"
    path.write_bytes(b"\x7fELF-on-disk")
    store["path"] = ObjectCode.from_cubin(str(path))
    path.write_bytes(b"changed later")  # read at write time: the cache keeps what it saw
    assert store["path"] == b"\x7fELF-on-disk"


def test_capabilities_are_declared_and_a_tiered_store_answers_for_its_tiers(tmp_path) -> None:
    """What single flight, the header trace and tiered writes use is stated by every store:
    none by default, a file store's own, and a tiered store's from the tier that has it."""
    memory = InMemoryProgramCache()
    disk = FileStreamProgramCache(tmp_path / "c")
    assert (memory.read_only, memory.lock_path("k.lock"), memory.has_remote_lock, memory.tmp_dir) == (
        False,
        None,
        False,
        None,
    )
    with memory.remote_lock("k", time.monotonic() + 1, lambda: False) as outcome:
        assert outcome == "unavailable"
    tiered = TieredProgramCache([memory, disk])
    assert (
        tiered.lock_path("k.lock") == disk.lock_path("k.lock") == str(tmp_path / "c" / FORMAT_DIR / "locks" / "k.lock")
    )
    assert tiered.tmp_dir == disk.tmp_dir and os.path.isdir(disk.tmp_dir)
    assert tiered.file_root == disk.file_root == str(tmp_path / "c")
    assert not tiered.read_only and not tiered.has_remote_lock
    assert TieredProgramCache([InMemoryProgramCache()]).lock_path("k.lock") is None
    tiered.close()


def test_a_path_backed_object_code_at_a_fifo_is_refused_never_waited_on(tmp_path) -> None:
    """A cuda.core ObjectCode made from a path is read when stored; a FIFO there is refused at once
    (regular_file.read_regular) instead of waiting for a writer forever."""
    import signal

    from cuda.core import ObjectCode

    from kernelcache import InMemoryProgramCache
    from kernelcache.regular_file import NotRegularFileError

    fifo = tmp_path / "kernel.cubin"
    os.mkfifo(fifo)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the store waited on a FIFO"))
    signal.alarm(20)
    try:
        with pytest.raises(NotRegularFileError):
            InMemoryProgramCache()[b"k"] = ObjectCode.from_cubin(str(fifo))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
