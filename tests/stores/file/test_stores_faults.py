"""FileStreamProgramCache under faults and hostile neighbours.

Everything here is provoked for real: immutable directories (chattr +i: root ignores mode
bits, not that), FIFOs and symlinks planted in the tree, racing processes, a read-only mount.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import warnings

import _workers as w
import pytest
from helpers import REPO, mounted_tmpfs, remount_read_only

from kernelcache import FileStreamProgramCache
from kernelcache.stores.file.store import FORMAT_DIR

CTX = mp.get_context("spawn")
# Children import the kernelcache this test runs against (PYTHONPATH), else this checkout's.
SRC_DIR = os.environ.get("PYTHONPATH") or os.path.join(
    REPO, "src"
)


def _only_entry(root) -> str:
    (entry,) = [
        os.path.join(d, f)
        for d, _, fs in os.walk(os.path.join(root, FORMAT_DIR, "entries"))
        for f in fs
        if not f.endswith(".meta")
    ]
    return entry


def _chattr(flag: str, path: str) -> None:
    proc = subprocess.run(["chattr", flag, path], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"chattr {flag} is not available here: {proc.stderr.strip()}")


def _get_in_child(root: str, key: str, timeout: float = 30) -> str:
    """cache.get(key) in a fresh process with a memory limit; its printed result, or 'HUNG'."""
    code = (
        "import resource, sys, warnings\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "warnings.simplefilter('ignore')\n"
        "from kernelcache import FileStreamProgramCache\n"
        "print(repr(FileStreamProgramCache(sys.argv[1]).get(sys.argv[2])))\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC_DIR}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, root, key], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return "HUNG"
    return proc.stdout.strip() or f"rc={proc.returncode} {proc.stderr.strip()[-300:]}"


# -- #4 entries over 2 GiB: read in a loop ---------------------------------------------------


def test_entries_are_read_in_a_loop_of_chunks(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    payload = os.urandom(10_007)
    cache["big"] = payload
    reader = FileStreamProgramCache(tmp_path)
    reader.read_chunk_bytes = 1000  # a single read() returns at most this, as ~2 GiB does for real
    assert reader.get("big") == payload
    assert reader.get("big") == payload  # the per-process memo path reads the same way
    assert reader.stats()["errors"] == 0 and _only_entry(tmp_path)


@pytest.mark.skipif(os.environ.get("KERNELCACHE_BIG_TESTS") != "1", reason="writes 2.1 GB; KERNELCACHE_BIG_TESTS=1")
def test_an_entry_over_2_gib_round_trips(tmp_path) -> None:
    size = (2 << 30) + 4096
    payload = b"\x5a" * size
    cache = FileStreamProgramCache(tmp_path)
    cache["huge"] = payload
    del payload
    got = FileStreamProgramCache(tmp_path).get("huge")
    assert got is not None and len(got) == size


# -- #5 two concurrent set() of one key ------------------------------------------------------


def test_two_concurrent_sets_of_one_key_leave_one_of_the_values(tmp_path) -> None:
    root, rounds = str(tmp_path), 600
    barrier = CTX.Barrier(2)
    procs = [CTX.Process(target=w.set_in_lockstep, args=(root, n, rounds, barrier)) for n in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    cache = FileStreamProgramCache(root)
    absent = [r for r in range(rounds) if cache.get(f"r{r}") not in (b"A" * 3000 + b"%d" % r, b"B" * 5000 + b"%d" % r)]
    assert absent == [], f"{len(absent)} of {rounds} keys lost both values"


# -- #6 a failed unlink is not "absent"; a failed eviction is not silent -----------------------


def test_del_that_cannot_unlink_is_not_a_key_error(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"value"
    shard = os.path.dirname(_only_entry(tmp_path))
    _chattr("+i", shard)  # unlink inside it fails with EPERM, even for root
    try:
        with pytest.raises(OSError) as raised:
            del cache["k"]
        assert not isinstance(raised.value, KeyError)
        assert cache.get("k") == b"value"
        cache.discard("k")  # the forgiving form degrades to a warning, never raises
    finally:
        _chattr("-i", shard)
    del cache["k"]
    with pytest.raises(KeyError):
        del cache["k"]


# -- #12 hostile files: FIFOs and device symlinks never hang a reader --------------------------


@pytest.mark.parametrize("where", ["entry", "sidecar"])
def test_a_fifo_in_the_tree_is_a_miss_not_a_hang(tmp_path, where: str) -> None:
    FileStreamProgramCache(tmp_path)["k"] = b"value"
    target = _only_entry(tmp_path) + (".meta" if where == "sidecar" else "")
    os.unlink(target)
    os.mkfifo(target, 0o600)
    assert _get_in_child(str(tmp_path), "k") == "None"
    assert os.path.exists(target)  # not ours to judge: left in place
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"again"  # a write replaces the name as usual
    assert cache.get("k") == b"again"


def test_an_entry_symlinked_to_dev_zero_is_a_miss(tmp_path) -> None:
    FileStreamProgramCache(tmp_path)["k"] = b"value"
    entry = _only_entry(tmp_path)
    os.unlink(entry)
    os.symlink("/dev/zero", entry)
    assert _get_in_child(str(tmp_path), "k") == "None"


# -- #14 stats and lock files are never followed through a symlink ------------------------------


def _planted(tmp_path, relative: str) -> tuple[str, bytes]:
    root = tmp_path / "c"
    FileStreamProgramCache(root).close()  # creates the tree
    victim = tmp_path / "victim"
    content = b"precious bytes of someone else's file\n" * 4
    victim.write_bytes(content)
    link = root / FORMAT_DIR / relative
    if link.exists():
        link.unlink()
    os.symlink(victim, link)
    return str(root), content


def test_a_symlinked_stats_file_is_not_written_through(tmp_path) -> None:
    root, content = _planted(tmp_path, "stats")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache = FileStreamProgramCache(root)
        cache["k"] = b"value"
        assert cache.get("k") == b"value"
        cache.close()
    assert (tmp_path / "victim").read_bytes() == content


def test_a_symlinked_evict_lock_neither_truncates_its_target_nor_stops_eviction(tmp_path) -> None:
    root, content = _planted(tmp_path, "locks/evict.lock")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache = FileStreamProgramCache(root, max_size_bytes=10_000)
        for i in range(30):
            cache[f"k{i}"] = b"x" * 1000
    assert (tmp_path / "victim").read_bytes() == content
    assert cache.stats()["evictions"] >= 1
    on_disk = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(os.path.join(root, FORMAT_DIR, "entries"))
        for f in fs
    )
    assert on_disk <= 10_000


def test_a_symlinked_single_flight_lock_is_not_followed(tmp_path) -> None:
    from kernelcache.compile.flight import SingleFlight

    cache = FileStreamProgramCache(tmp_path / "c")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = cache.lock_path("abc.lock")
    os.symlink(elsewhere / "created-through-the-link", path)  # dangling: locking would create it
    with SingleFlight(b"abc", 2, lock_path=path).hold() as outcome:
        assert outcome in ("acquired", "timeout")
    assert os.listdir(elsewhere) == []


# -- #16 a default cache directory that cannot be created ---------------------------------------


def test_read_only_home_compiles_uncached_with_one_warning(tmp_path) -> None:
    with mounted_tmpfs("1m") as home:
        remount_read_only(home)
        env = {k: v for k, v in os.environ.items() if k not in ("KERNELCACHE_DIR", "XDG_CACHE_HOME")}
        env.update(HOME=home, PYTHONPATH=SRC_DIR)
        code = (
            "import warnings\n"
            "from cuda.core import ProgramOptions\n"
            "from kernelcache import CompileInfo, KernelCacheWarning, compile_program\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    for _ in range(2):\n"
            "        info = CompileInfo()\n"
            "        obj = compile_program('extern \"C\" __global__ void k() {}', "
            "options=ProgramOptions(arch='sm_90'), info=info)\n"
            "print(len(obj.code) > 0, info.cached, [str(w.message) for w in caught if w.category is KernelCacheWarning])\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ok, cached, caught = proc.stdout.strip().split(" ", 2)
    assert ok == "True" and cached == "False"
    assert caught.count("kernelcache:") == 1 and "uncached" in caught


# -- #18 a store used after close() keeps its cap and its shared counters -------------------------


def test_a_closed_store_keeps_its_cap_and_counters(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=10_000)
    cache["first"] = b"f" * 1000
    cache.close()
    for i in range(18):
        cache[f"k{i}"] = b"x" * 1000
    on_disk = sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / FORMAT_DIR / "entries") for f in fs
    )
    assert on_disk <= 10_000
    assert cache.stats()["evictions"] >= 1
    cache.close()
    assert FileStreamProgramCache(tmp_path).stats()["stores"] == 19  # the counters stayed shared
