"""kernelcache.triton with the real Triton package: its own get_cache_manager picks our class
from the environment, and files and groups travel between real processes through a real
kernelcache store. (CPU only: Triton's cache layer needs no GPU.)"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import pytest

pytest.importorskip("triton")

from helpers import support_script  # noqa: E402
from redis_servers import RedisServer, need_redis  # noqa: E402
from triton.runtime import cache as triton_cache  # noqa: E402

from kernelcache.stores.file.store import FORMAT_DIR, FileStreamProgramCache  # noqa: E402

WORKER = support_script("_triton_worker.py")
NAMES = ["kern.source", "kern.ttir", "kern.ptx", "kern.cubin", "kern.json"]
MANAGER = "kernelcache.triton:KernelCacheManager"


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()  # what Triton passes get_cache_manager


def _env(root: str, **extra: str) -> dict[str, str]:
    # Every member of a group stored (IRs too), unless a test says otherwise.
    env = dict(os.environ, KERNELCACHE_DIR=str(root), TRITON_CACHE_MANAGER=MANAGER, TRITON_STORE_BINARY_ONLY="0")
    env.update(extra)
    return env


def _run(env: dict[str, str], *args: str) -> dict:
    out = subprocess.run([sys.executable, WORKER, *args], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _entries_bytes(root: str) -> int:
    total = 0
    for d, _, files in os.walk(os.path.join(root, FORMAT_DIR, "entries")):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    return total


def test_triton_picks_our_manager_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    from kernelcache.triton import KernelCacheManager

    manager = triton_cache.get_cache_manager(_key("a"))
    assert type(manager) is KernelCacheManager
    assert isinstance(manager, triton_cache.CacheManager)


@pytest.mark.parametrize("binary_only", ["", "0"])
def test_real_triton_compile_in_a_fresh_process_is_a_hit(tmp_path, binary_only):
    # triton.compile for sm_90 runs on CPU (Triton's own ptxas): the second process must
    # take the whole group from kernelcache and compile nothing; Triton's directory stays unused.
    # The IRs (ptx, ttir, ...) are stored only with TRITON_STORE_BINARY_ONLY=0.
    env = _env(tmp_path / "kc", TRITON_CACHE_DIR=str(tmp_path / "triton-own"), TRITON_STORE_BINARY_ONLY=binary_only)
    cold = _run(env, "compile")
    warm = _run(env, "compile")
    assert (cold["compiled"], cold["hits"]) == (1, 0)
    assert (warm["compiled"], warm["hits"]) == (0, 1)
    assert warm["cubin_sha256"] == cold["cubin_sha256"]
    exts = {f.rsplit(".", 1)[1] for f in warm["files"]}
    assert exts == ({"cubin", "json"} if binary_only == "" else {f.rsplit(".", 1)[1] for f in cold["files"]})
    assert {f.rsplit(".", 1)[1] for f in cold["files"]} >= {"cubin", "json", "ptx", "ttir"}
    assert all(p.startswith(str(tmp_path / "kc" / "materialized")) for p in warm["paths"])
    assert not (tmp_path / "triton-own").exists()
    # The IRs Triton read right after the compile were scratch copies, gone with their process.
    assert not (tmp_path / "kc" / "materialized" / "scratch").exists() or not [
        f for _, _, fs in os.walk(tmp_path / "kc" / "materialized" / "scratch") for f in fs
    ]


def test_files_and_groups_round_trip_between_processes(tmp_path):
    root = tmp_path / "kc"
    key = _key("round-trip")
    wrote = _run(_env(root), "put", key, "v1", *NAMES)["paths"]
    # Copies live under the cache root, never in the system temp dir.
    assert all(p.startswith(str(root / "materialized")) for p in wrote.values())
    # The reader gets the group from the store, not from the writer's copies.
    for d, _, files in os.walk(root / "materialized", topdown=False):
        for f in files:
            os.unlink(os.path.join(d, f))
    got = _run(_env(root), "get", key, *NAMES)["group"]
    assert got == {name: f"v1:{name}" for name in NAMES}
    # The group is one row in ls (its files are entries the tools check; show lists them).
    ls = subprocess.run(
        [sys.executable, "-m", "kernelcache", "ls", "--json", "--cache-dir", str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(ls.stdout)
    assert [r["target_type"] for r in rows] == ["group"]
    assert {r["code_type"] for r in rows} == {"triton"}
    verify = subprocess.run(
        [sys.executable, "-m", "kernelcache", "verify", "--json", "--cache-dir", str(root)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(verify.stdout)["checked"] == 1  # the group is one entry holding every member


def test_single_files_round_trip_and_missing_is_none(tmp_path, monkeypatch):
    root = tmp_path / "kc"
    monkeypatch.setenv("KERNELCACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    manager = triton_cache.get_cache_manager(_key("single"))
    assert manager.get_file("launcher.so") is None
    path = manager.put(b"\x7fELF binary", "launcher.so", binary=True)
    text_path = manager.put('{"configs_timings": []}', "kern.autotune.json", binary=False)
    code = (
        "from triton.runtime.cache import get_cache_manager\n"
        f"m = get_cache_manager({_key('single')!r})\n"
        "print(open(m.get_file('launcher.so'), 'rb').read().hex(), open(m.get_file('kern.autotune.json')).read())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.split(" ", 1) == [b"\x7fELF binary".hex(), '{"configs_timings": []}\n']
    with open(path, "rb") as f:
        assert f.read() == b"\x7fELF binary"
    assert os.path.dirname(os.path.dirname(path)) == os.path.dirname(os.path.dirname(text_path))


def test_copies_count_once_in_the_size_tracker(tmp_path, monkeypatch):
    """One budget: the copies Triton is handed count under the store's cap with their own bytes
    (a hard link to an entry has none), each file once: the tracker is what a scan finds."""
    root = tmp_path / "kc"
    monkeypatch.setenv("KERNELCACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    manager = triton_cache.get_cache_manager(_key("size"))
    paths = {n: manager.put(os.urandom(4096), n) for n in NAMES}
    manager.put_group("kern.json", paths)
    for _ in range(3):
        assert manager.get_group("kern.json") is not None
    with FileStreamProgramCache(root) as store:
        on_disk = store.lru_candidates()[1]
        assert store.stats()["size_bytes"] == on_disk
    assert on_disk >= _entries_bytes(str(root)) + 5 * 4096  # the entries, and the copies' own bytes


def test_writer_killed_mid_group_leaves_no_group(tmp_path):
    root = tmp_path / "kc"
    key = _key("killed")
    proc = subprocess.Popen(
        [sys.executable, WORKER, "put-partial", key, "v1", "3", *NAMES],
        env=_env(root),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert _run(_env(root), "get", key, *NAMES)["group"] is None


def test_complete_group_then_killed_rewriter_is_never_mixed(tmp_path):
    # v1 is complete; a v2 writer puts two members and dies before its group. A reader
    # must not get v2 members with v1's others (Triton's own FileCacheManager would): it gets
    # v1 whole, since members reach the store only with their group.
    root = tmp_path / "kc"
    key = _key("rewritten")
    _run(_env(root), "put", key, "v1", *NAMES)
    proc = subprocess.Popen(
        [sys.executable, WORKER, "put-partial", key, "v2", "2", *NAMES],
        env=_env(root),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert _run(_env(root), "get", key, *NAMES)["group"] == {n: f"v1:{n}" for n in NAMES}
    _run(_env(root), "put", key, "v2", *NAMES)  # the next compile puts a whole group again
    assert _run(_env(root), "get", key, *NAMES)["group"] == {n: f"v2:{n}" for n in NAMES}


def test_corrupt_member_makes_the_group_a_miss(tmp_path):
    root = tmp_path / "kc"
    key = _key("corrupt")
    _run(_env(root), "put", key, "v1", *NAMES)
    victim = offset = None
    for d, _, files in os.walk(root / FORMAT_DIR / "entries"):
        for f in files:
            path = os.path.join(d, f)
            if not f.endswith(".meta") and b"v1:kern.ptx" in _read(path):
                victim, offset = path, _read(path).index(b"v1:kern.ptx")
    assert victim is not None
    with open(victim, "r+b") as f:
        f.seek(offset)
        f.write(b"v9")  # one member's bytes: same size, other bytes
    assert _run(_env(root), "get", key, *NAMES)["group"] is None


def test_concurrent_readers_never_see_a_partial_or_mixed_group(tmp_path):
    root = tmp_path / "kc"
    key = _key("concurrent")
    _run(_env(root), "put", key, "v0", *NAMES)
    seconds = "3"
    procs = [
        subprocess.Popen([sys.executable, WORKER, cmd, key, seconds, *NAMES], env=_env(root), stdout=subprocess.PIPE)
        # Two writers: each one's put_group races the other's member rewrites.
        for cmd in ("write-loop", "write-loop", "read-loop", "read-loop")
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    writers, readers = results[:2], results[2:]
    assert all(w["rounds"] > 5 for w in writers)
    assert sum(r["mixed"] for r in readers) == 0, readers
    assert sum(r["complete"] for r in readers) > 0, readers  # the check had groups to look at


def test_dump_and_override_delegate_to_tritons_file_manager(tmp_path, monkeypatch):
    from kernelcache.triton import KernelCacheManager

    root = tmp_path / "kc"
    monkeypatch.setenv("KERNELCACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    monkeypatch.setenv("TRITON_DUMP_DIR", str(tmp_path / "dump"))
    monkeypatch.setenv("TRITON_OVERRIDE_DIR", str(tmp_path / "override"))
    dump = triton_cache.get_dump_manager(_key("src"))
    assert type(dump) is KernelCacheManager
    path = dump.put("// ttir", "kern.ttir")
    assert path.startswith(str(tmp_path / "dump"))
    assert _read(path) == b"// ttir"
    override = triton_cache.get_override_manager(_key("src"))
    assert override.get_file("kern.ttir") is None
    mine = tmp_path / "override" / os.path.relpath(path, tmp_path / "dump")
    mine.parent.mkdir(parents=True)
    mine.write_text("// mine")
    assert _read(override.get_file("kern.ttir")) == b"// mine"
    assert not (root / FORMAT_DIR / "entries").exists() or _entries_bytes(str(root)) == 0


def test_remote_backend_round_trip_between_processes(tmp_path):
    root = tmp_path / "kc"
    key = _key("remote")

    def env(triton_dir: str) -> dict[str, str]:
        return _env(
            root,
            TRITON_CACHE_MANAGER="triton.runtime.cache:RemoteCacheManager",
            TRITON_REMOTE_CACHE_BACKEND="kernelcache.triton:KernelCacheRemoteBackend",
            TRITON_CACHE_DIR=str(tmp_path / triton_dir),
        )

    _run(env("host-a"), "put", key, "v1", *NAMES)
    # Host b has an empty Triton directory: the group comes from kernelcache's store.
    assert _run(env("host-b"), "get", key, *NAMES)["group"] == {n: f"v1:{n}" for n in NAMES}
    # A group whose writer died after two members is no group for the remote path either.
    proc = subprocess.Popen(
        [sys.executable, WORKER, "put-partial", _key("remote-killed"), "v1", "2", *NAMES],
        env=env("host-c"),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert _run(env("host-d"), "get", _key("remote-killed"), *NAMES)["group"] is None


def test_clear_and_prune_remove_the_copies(tmp_path, monkeypatch):
    root = tmp_path / "kc"
    monkeypatch.setenv("KERNELCACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    manager = triton_cache.get_cache_manager(_key("prune"))
    old = manager.put(b"old", "old.cubin")
    new = manager.put(b"new", "new.cubin")
    long_ago = time.time() - 3600
    os.utime(old, (long_ago, long_ago))
    cli = [sys.executable, "-m", "kernelcache"]
    out = subprocess.run([*cli, "prune", "--older-than", "30d", "--json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["materialized_removed"] == 1
    assert not os.path.exists(old) and os.path.exists(new)
    # A copy pruned is rematerialized from the store on the next get.
    assert _read(manager.get_file("old.cubin")) == b"old"
    out = subprocess.run([*cli, "clear", "--yes"], capture_output=True, text=True, check=True)
    assert "materialized copies" in out.stdout
    assert not os.path.exists(new)
    assert [f for _, _, files in os.walk(root / "materialized") for f in files] == []


def test_file_names_cannot_escape_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    manager = triton_cache.get_cache_manager(_key("escape"))
    for bad in ("../evil.so", "a/b", "..", ""):
        with pytest.raises(ValueError, match="plain name"):
            manager.put(b"x", bad)


@pytest.mark.parametrize("hook", ["manager", "remote-backend"])
def test_redis_round_trip_between_hosts_with_empty_local_directories(tmp_path, hook):
    # Two "hosts": separate KERNELCACHE_DIR (and Triton directories), one Redis. The default
    # store is memory -> disk -> Redis because KERNELCACHE_REDIS_URL is set.
    need_redis()
    server = RedisServer(str(tmp_path))
    try:
        key = _key(f"fleet-{hook}")

        def host(name: str) -> dict[str, str]:
            env = _env(
                tmp_path / name / "kc", KERNELCACHE_REDIS_URL=server.url, TRITON_CACHE_DIR=str(tmp_path / name / "t")
            )
            if hook == "remote-backend":
                env["TRITON_CACHE_MANAGER"] = "triton.runtime.cache:RemoteCacheManager"
                env["TRITON_REMOTE_CACHE_BACKEND"] = "kernelcache.triton:KernelCacheRemoteBackend"
            return env

        _run(host("a"), "put", key, "v1", *NAMES)
        assert not (tmp_path / "b").exists()
        assert _run(host("b"), "get", key, *NAMES)["group"] == {n: f"v1:{n}" for n in NAMES}
        # It came over Redis: host b's disk tier now holds the entries it read (promoted).
        assert _entries_bytes(str(tmp_path / "b" / "kc")) > 0
        server.stop()
        server.start()  # an empty Redis (no persistence): the group is now only on the hosts' disks
        assert _run(host("c"), "get", key, *NAMES)["group"] is None
    finally:
        server.stop()


@pytest.mark.parametrize("remote", [False, True], ids=["manager", "remote-backend"])
def test_unusable_cache_dir_never_fails_a_triton_compile(tmp_path, remote):
    # KERNELCACHE_DIR owned by another user (a shared HOME, sudo): the default cache refuses
    # it. compile_program then compiles uncached with one warning; a Triton compile must go on
    # too (Triton's own directory), not raise out of get_cache_manager.
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    os.chown(theirs, 65534, 65534)
    extra = {"TRITON_CACHE_DIR": str(tmp_path / "triton-own")}
    if remote:
        extra["TRITON_CACHE_MANAGER"] = "triton.runtime.cache:RemoteCacheManager"
        extra["TRITON_REMOTE_CACHE_BACKEND"] = "kernelcache.triton:KernelCacheRemoteBackend"
    env = _env(theirs, **extra)
    cold = _run(env, "compile")
    assert (cold["compiled"], cold["hits"]) == (1, 0)
    if not remote:  # Triton's own cache serves the next process, as without kernelcache
        warm = _run(env, "compile")
        assert (warm["compiled"], warm["hits"]) == (0, 1)
        assert warm["cubin_sha256"] == cold["cubin_sha256"]


def test_copies_handed_out_while_prune_runs_are_always_placed(tmp_path):
    # prune keeps recent copies but removes every empty directory, the one a copy is about
    # to be renamed into included: that copy failed (FileNotFoundError), so Triton's put fell
    # back to its own directory and get_group missed, with a warning that the cache root
    # "cannot be written" (a few in a thousand here).
    from kernelcache.integrations.materialized import materialize

    root = tmp_path / "kc"
    pruner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from kernelcache.integrations.materialized import KEEP_RECENT_S, remove_materialized\n"
            "end = time.time() + 3\n"
            "while time.time() < end:\n"
            "    remove_materialized(sys.argv[1], KEEP_RECENT_S)  # what `kernelcache prune` runs\n",
            str(root),
        ]
    )
    try:
        placed = 0
        while pruner.poll() is None:
            data = os.urandom(64)
            assert _read(materialize(str(root), "triton", "KEY", "kern.cubin", data)) == data
            placed += 1
    finally:
        pruner.wait(30)
    assert placed > 0
    staging = root / "materialized" / "tmp"  # prune may have removed it, empty
    assert not staging.exists() or os.listdir(staging) == []  # no staged copy left behind


def test_a_group_naming_a_path_is_a_miss_and_writes_nothing_outside(tmp_path, monkeypatch):
    # Any writer of an unsigned store (another host, another version) can store a group whose
    # member is "../../x". Triton's RemoteCacheManager materializes members by name in its
    # own directory: it wrote outside it; KernelCacheManager.get_group raised ValueError.
    from triton.runtime.cache import RemoteCacheManager

    from kernelcache.integrations.triton_files import TritonFiles
    from kernelcache.stores.default import default_cache
    from kernelcache.triton import KernelCacheManager, KernelCacheRemoteBackend

    triton_dir = tmp_path / "triton" / "cache"
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_dir))
    monkeypatch.setenv("TRITON_REMOTE_CACHE_BACKEND", "kernelcache.triton:KernelCacheRemoteBackend")
    key = _key("escape")
    TritonFiles(key, default_cache()).put_group("kern.json", {"../../escaped": b"outside", "kern.cubin": b"c"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kernelcache.triton warns once per process and cause
        assert RemoteCacheManager(key).get_group("kern.json") is None
        assert KernelCacheManager(key).get_group("kern.json") is None
    assert not (tmp_path / "triton" / "escaped").exists()
    # And the backend itself stores no such name or group.
    backend = KernelCacheRemoteBackend(key)
    with pytest.raises(ValueError, match="plain name"):
        backend.put("../../escaped", b"outside")
    backend.put("kern.cubin", b"c")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend.put("__grp__other.json", json.dumps({"child_paths": ["kern.cubin", "../x"]}).encode())
    assert KernelCacheManager(key).get_group("other.json") is None


def test_a_damaged_local_group_falls_through_to_the_complete_remote_one(tmp_path, monkeypatch):
    # Host b's disk holds the group with one member's bytes damaged; Redis holds it whole.
    # b must not miss for ever on its local tier: it reads Redis's group and repairs its own.
    need_redis()
    from kernelcache.integrations.triton_files import TritonFiles
    from kernelcache.stores.redis.store import RedisProgramCache

    server = RedisServer(str(tmp_path))
    try:
        key = _key("damaged-local")
        monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "t"))
        mkey = triton_cache.get_cache_manager(key).key  # the key Triton hands a cache manager
        members = {n: f"v2:{n}".encode() for n in NAMES}
        disk = FileStreamProgramCache(str(tmp_path / "b" / "kc"))
        TritonFiles(mkey, disk).put_group("kern.json", members)
        TritonFiles(mkey, RedisProgramCache(server.url)).put_group("kern.json", members)
        (entry,) = [e.path for e in disk.iter_entries()]
        with open(entry, "r+b") as f:
            f.write(b"v9")  # the first member's version: same size, other bytes
        env = _env(tmp_path / "b" / "kc", KERNELCACHE_REDIS_URL=server.url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert _run(env, "get", key, *NAMES)["group"] == {n: f"v2:{n}" for n in NAMES}
        server.stop()  # the local tier alone now serves the repaired group
        assert TritonFiles(mkey, FileStreamProgramCache(str(tmp_path / "b" / "kc"))).get_group("kern.json") == members
    finally:
        server.stop()


BOUNDED = r"""
import os, sys
from triton.runtime.cache import get_cache_manager
first, count, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for i in range(first, first + count):
    m = get_cache_manager(f"{i:064x}")
    paths = {n: m.put(os.urandom(size), n) for n in ("kern.cubin", "kern.json")}
    m.put_group("kern.json", paths)
    m.get_group("kern.json")  # under a cap this small, the newest group may already be evicted for room
"""


def _copies(root) -> tuple[int, int]:
    """(files, bytes of their own) under materialized/: a hard link to an entry costs none."""
    files = own = 0
    for d, _, names in os.walk(os.path.join(root, "materialized")):
        for name in names:
            st = os.lstat(os.path.join(d, name))
            files += 1
            own += st.st_size if st.st_nlink == 1 else 0
    return files, own


def _age(root, seconds: float) -> None:
    for d, _, names in os.walk(os.path.join(root, "materialized")):
        for name in names:
            path = os.path.join(d, name)
            st = os.lstat(path)
            os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


IN_PROCESS = r"""
import json, os, sys
from triton.runtime.cache import get_cache_manager
root = os.environ["KERNELCACHE_DIR"]

def disk():  # what the tree takes: entries and sidecars, and the copies' own bytes (each inode once)
    seen, total = set(), 0
    for d, _, names in os.walk(root):
        for name in names:
            st = os.lstat(os.path.join(d, name))
            if name != "stats" and st.st_ino not in seen:
                seen.add(st.st_ino)
                total += st.st_size
    return total

peak = 0
for i in range(12):
    m = get_cache_manager(f"{i + 100:064x}")
    paths = {n: m.put(os.urandom(100000), n) for n in ("kern.cubin", "kern.json")}
    m.put_group("kern.json", paths)
    m.get_group("kern.json")
    for d, _, names in os.walk(os.path.join(root, "materialized")):  # Triton read them: time passes
        for name in names:
            st = os.lstat(os.path.join(d, name))
            os.utime(os.path.join(d, name), (st.st_atime - 30, st.st_mtime - 30))
    peak = max(peak, disk())
print(json.dumps(peak))
"""


def test_copies_stay_within_the_cap_and_idle_ones_go_without_a_prune(tmp_path):
    """One budget: a 1 MB cap and 2.4 MB of kernels in one process; entries and the copies
    handed to Triton together stay within the cap (and the one write the invariant allows over
    it) while the process runs. Before, the copies had a budget of their own equal to the cap:
    twice the cap on disk."""
    root = tmp_path / "kc"
    env = _env(root, KERNELCACHE_MAX_SIZE="1MB")
    out = subprocess.run([sys.executable, "-c", IN_PROCESS], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) <= 1_000_000 + 250_000
    for first in (0, 12):
        subprocess.run([sys.executable, "-c", BOUNDED, str(first), "12", "100000"], env=env, check=True, timeout=300)
        _age(root, 30)  # older than the few seconds a fresh copy is protected
    subprocess.run([sys.executable, "-c", BOUNDED, "24", "2", "100000"], env=env, check=True, timeout=300)
    assert _copies(root)[1] + _entries_bytes(str(root)) <= 1_000_000 + 250_000
    # Idle for longer than prune's margin: the next copies written take them away.
    _age(root, 3600)
    subprocess.run([sys.executable, "-c", BOUNDED, "30", "1", "1000"], env=env, check=True, timeout=300)
    files, _ = _copies(root)
    assert files <= 3  # the last group's two copies (and the sweep's own stamp)


def test_copies_swept_during_a_long_compile_are_back_before_triton_reads_them(tmp_path):
    # Triton puts a kernel's source first and reads every path it got back only after its
    # last stage (CompiledKernel), seconds or minutes later. Meanwhile another process over
    # the copies' cap sweeps the oldest ones: the group must still be stored, and every path
    # Triton holds must still hold what it put.
    root = tmp_path / "kc"
    key = _key("slow-compile")
    env = _env(root, KERNELCACHE_MAX_SIZE="1MB")
    writer = subprocess.Popen(
        [sys.executable, WORKER, "put-slow", key, "v1", *NAMES],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "ready"
        _age(root, 30)  # as after a compile of 30 s: older than a fresh copy's protection
        # Another process builds two launchers: 1.2 MB of copies over the 1 MB cap.
        code = (
            "import os\n"
            "from triton.runtime.cache import get_cache_manager\n"
            f"m = get_cache_manager({_key('launchers')!r})\n"
            "for n in ('a.so', 'b.so'): m.put(os.urandom(600_000), n)\n"
        )
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert json.loads(writer.stdout.readline()) == {"readable": True}
    finally:
        writer.kill()
        writer.wait(timeout=60)
    assert _run(env, "get", key, *NAMES)["group"] == {name: f"v1:{name}" for name in NAMES}


PUT_FILE = (
    "import sys\nfrom triton.runtime.cache import get_cache_manager\n"
    "get_cache_manager(sys.argv[1]).put(b'{\"configs_timings\": []}', sys.argv[2], binary=False)\n"
)
GET_FILE = "import sys\nfrom triton.runtime.cache import get_cache_manager\nprint(get_cache_manager(sys.argv[1]).get_file(sys.argv[2]))\n"
SWEEP = "import sys\nfrom kernelcache.integrations.materialized import sweep\nsweep(sys.argv[1], 1 << 20)\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to see what the sweeper reads")
def test_a_copy_handed_out_while_a_sweep_reads_it_is_not_removed_by_it(tmp_path):
    """Taking a copy for room reads it whole first (it must hash to its name: kernelcache removes
    no file it did not write); another process may hand it out meanwhile (its mtime bumped):
    that one must stay. The sweeper is stopped (SIGSTOP) while it reads the copy, the copy is
    handed out, and it goes on: so the interleaving is this one every time."""
    root = tmp_path / "kc"
    env = _env(root)
    key, name = _key("handed-out"), "fn.autotune.json"
    data = os.urandom(1 << 20).hex() * 32  # 64 MB: over the sweep's 1 MB cap, long to read

    def py(code: str, *args: str) -> str:
        out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    put = PUT_FILE.replace("b'{\"configs_timings\": []}'", "open(sys.argv[3], 'rb').read()")
    (tmp_path / "big.json").write_text(data)
    py(put, key, name, str(tmp_path / "big.json"))
    shared = py(GET_FILE, key, name)  # the shared copy: a link to the entry
    py(put, key, name, str(tmp_path / "big.json"))  # stored again: a new entry, the copy its only link
    assert os.stat(shared).st_nlink == 1
    st = os.stat(shared)
    os.utime(shared, (st.st_atime - 60, st.st_mtime - 60))  # handed out a minute ago
    sweeper = subprocess.Popen([sys.executable, "-c", SWEEP, str(root)], env=env)
    try:
        deadline = time.time() + 60
        while shared not in _open_files(sweeper.pid):
            assert sweeper.poll() is None and time.time() < deadline, "the sweeper never read the copy"
        os.kill(sweeper.pid, signal.SIGSTOP)
        assert py(GET_FILE, key, name) == shared  # handed out again: its mtime is now
        os.kill(sweeper.pid, signal.SIGCONT)
        assert sweeper.wait(timeout=60) == 0
    finally:
        sweeper.kill()
        sweeper.wait(timeout=60)
    assert _read(shared) == data.encode()


def _open_files(pid: int) -> set[str]:
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return found


def test_ls_shows_one_row_per_triton_kernel_show_its_members_stats_its_hits(tmp_path):
    # A real triton.compile (sm_90, on CPU), then a second process's hit.
    root = tmp_path / "kc"
    env = _env(root, TRITON_STORE_BINARY_ONLY="")
    _run(env, "compile")
    _run(env, "compile")
    cli = [sys.executable, "-m", "kernelcache"]
    rows = json.loads(
        subprocess.run([*cli, "ls", "--json"], env=env, capture_output=True, text=True, check=True).stdout
    )
    assert len(rows) == 1
    (row,) = rows
    assert (row["code_type"], row["target_type"], row["arch"], row["kernels"]) == ("triton", "group", "sm_90", ["axpy"])
    shown = subprocess.run([*cli, "show", row["key"][:12]], env=env, capture_output=True, text=True, check=True).stdout
    lines = shown.split("members:\n", 1)[1].splitlines()
    listed = [line.split() for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("  "))]]
    assert sorted(name for name, *_ in listed) == ["axpy.cubin", "axpy.json"]
    assert row["size"] == sum(int(size) for _, size, *_ in listed)
    stats = json.loads(
        subprocess.run([*cli, "stats", "--json"], env=env, capture_output=True, text=True, check=True).stdout
    )
    flat = stats.get("disk", stats) if isinstance(stats.get("disk"), dict) else stats
    assert flat["hits"] == 1 and flat["compile_seconds_saved"] > 0


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root and unshare(1)")
def test_a_process_of_the_same_pid_on_another_host_leaves_our_scratch_copies_alone(tmp_path):
    # Two hosts sharing one cache directory (a team cache on NFS) run processes of the same
    # pid: here two PID namespaces, where both workers get one pid. One exits (its atexit
    # removes its own scratch copies) while the other still holds the paths it was handed.
    # (A fresh PID namespace numbers its first process 1, every time.)
    root = tmp_path / "kc"
    key = _key("same-pid")
    _run(_env(root), "put", key, "v1", *NAMES)
    argv = ["unshare", "--pid", "--fork", sys.executable, WORKER]
    holder = subprocess.Popen(
        [*argv, "get-hold", key, *NAMES], env=_env(root), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        first = json.loads(holder.stdout.readline())
        pid_of = [*argv[:3], sys.executable, "-c", "import os; print(os.getpid())"]
        assert subprocess.run(pid_of, capture_output=True, text=True, check=True).stdout.strip() == str(first["pid"])
        other = subprocess.run([*argv, "get", key, *NAMES], env=_env(root), capture_output=True, text=True, timeout=120)
        assert other.returncode == 0, other.stderr
        assert json.loads(other.stdout.strip().splitlines()[-1])["group"] == {n: f"v1:{n}" for n in NAMES}
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert json.loads(holder.stdout.readline()) == {"intact": True}, first
    finally:
        holder.kill()
        holder.wait(timeout=60)
