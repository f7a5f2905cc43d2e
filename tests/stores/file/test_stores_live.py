"""The file store under live maintenance and load: real writer processes, a real CLI, real files.

verify --fix on a live cache, writers that outrun eviction (the tracker's invariant), and the
leftovers of killed writers (lock files). Exact counts only, no timings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import SUPPORT

import kernelcache
from kernelcache import FileStreamProgramCache
from kernelcache.stores.file.counters import FileStats

HERE = Path(SUPPORT)
WORKERS = str(HERE / "_trust_workers.py")
SRC = str(Path(kernelcache.__file__).parent.parent)
sys.path.insert(0, str(HERE))
from _trust_workers import value_for  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _worker(fn: str, *args: object) -> subprocess.Popen[str]:
    argv = [sys.executable, WORKERS, fn, *(json.dumps(a) for a in args)]
    return subprocess.Popen(argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen[str], timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], env=_env(), capture_output=True, text=True, timeout=300
    )


def _lost(root: Path, written: list[str], size: int) -> list[str]:
    cache = FileStreamProgramCache(root)
    lost = [k for k in written if cache.get(k) != value_for(k, size)]
    cache.close()
    return lost


# -- verify --fix on a live cache ----------------------------------------------------------------


def test_verify_fix_during_writes_loses_nothing(tmp_path: Path) -> None:
    """Writers publish pairs while `kernelcache verify --fix` runs again and again: no entry lost.

    Race provoked: verify lists the entries, then scans the sidecars; a pair published in
    between shows a sidecar whose entry was not in the list (classed "orphaned" before the
    fix), and a pair caught between its two renames looks like a mismatch ("corrupt").
    """
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    size = 3000
    writers = [_worker("write_keys", str(root), f"w{i}", 250, size) for i in range(3)]
    runs = fixed = 0
    while any(w.poll() is None for w in writers) or runs < 2:
        done = _cli("verify", "--fix", "--json", "--cache-dir", str(root))
        assert done.returncode in (0, 1), done.stderr
        fixed += json.loads(done.stdout)["fixed"]
        runs += 1
    written: list[str] = []
    for w in writers:
        got = _result(w)
        assert got["dropped"] == 0
        written += got["written"]
    assert len(written) == 750
    assert _lost(root, written, size) == []
    assert fixed == 0, "verify --fix removed files of a healthy cache"
    assert runs >= 2


def test_verify_fix_still_removes_old_damage(tmp_path: Path) -> None:
    """The fix keeps its teeth: an orphaned sidecar and a corrupt entry older than the scan go."""
    root = tmp_path / "cache"
    cache = FileStreamProgramCache(root)
    cache["a"] = b"A" * 100
    cache["b"] = b"B" * 100
    cache.close()
    entries = [p for p in (root).rglob("*") if p.is_file() and "entries" in p.parts]
    artifacts = sorted(p for p in entries if not p.name.endswith(".meta"))
    assert len(artifacts) == 2
    artifacts[0].unlink()  # its sidecar is now an orphan
    artifacts[1].write_bytes(b"X" * 100)  # same size, wrong bytes: corrupt
    old = time.time() - 3600
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (old, old))
    done = _cli("verify", "--fix", "--json", "--cache-dir", str(root))
    report = json.loads(done.stdout)
    assert len(report["corrupt"]) == 1 and len(report["orphaned_sidecars"]) == 1
    assert report["fixed"] == 2 and report["remaining"] == 0
    assert not [p for p in root.rglob("*") if p.is_file() and "entries" in p.parts]


# -- writers outrun eviction -----------------------------------------------------------------------


def _stats_path(root: Path) -> str:
    from kernelcache.stores.file.store import FORMAT_DIR

    return os.path.join(root, FORMAT_DIR, "stats")


def _disk_bytes(root: Path) -> int:
    """Every regular file's size under the cache (entries, sidecars, staged temp files)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name != "stats")


def test_tracked_size_never_exceeds_cap_by_more_than_one_value_per_writer(tmp_path: Path) -> None:
    """8 writer processes into a capped store: sampled tracked size <= cap + one value per writer.

    Race provoked: writers that find the store over the cap while another process holds the
    evict lock. Before the fix they returned at once ("that process frees the room") and the
    store ran at several times its cap.
    """
    root = tmp_path / "cache"
    size, cap, nwriters = 8192, 96 * 1024, 8
    FileStreamProgramCache(root, cap).close()
    stats = FileStats(_stats_path(root))
    writers = [_worker("write_keys", str(root), f"w{i}", 60, size, cap) for i in range(nwriters)]
    peak_tracked = peak_disk = samples = 0
    while any(w.poll() is None for w in writers):
        peak_tracked = max(peak_tracked, stats.snapshot()["size_bytes"])
        if samples % 10 == 0:
            try:
                peak_disk = max(peak_disk, _disk_bytes(root))
            except FileNotFoundError:
                pass  # a file vanished during the walk
        samples += 1
    dropped = sum(_result(w)["dropped"] for w in writers)
    stats.close()
    # a value plus its sidecar, per writer that may have reserved it while over the cap
    per_writer = size + 1024
    assert samples > 20
    assert dropped == 0
    assert peak_tracked <= cap + nwriters * per_writer, (peak_tracked, cap)
    assert peak_disk <= cap + nwriters * per_writer, (peak_disk, cap)
    assert _disk_bytes(root) <= cap + nwriters * per_writer


# -- leftovers ----------------------------------------------------------------------------------


def _tmp_files(root: Path) -> list[Path]:
    from kernelcache.stores.file.store import FORMAT_DIR

    return [p for p in (root / FORMAT_DIR / "tmp").iterdir() if p.is_file()]


def test_killed_writers_temp_files_are_counted_and_swept_by_eviction(tmp_path: Path) -> None:
    """A writer killed mid-write leaves a staged file; a live store's eviction counts and sweeps it.

    The store below is opened before the kill, so its start-up sweep cannot be what removes
    it. (A store opened afterwards sweeps it at once: no flock, so no live writer.)
    """
    root = tmp_path / "cache"
    size, cap = 1 << 20, 6 << 20
    store = FileStreamProgramCache(root, cap)
    leftovers: list[Path] = []
    for attempt in range(60):
        ready = tmp_path / f"ready{attempt}"
        proc = _worker("write_forever", str(root), f"k{attempt}", size, cap, str(ready))
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.005)
        time.sleep(0.01 + (attempt % 7) * 0.011)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        leftovers = [p for p in _tmp_files(root) if p.stat().st_size >= size // 2]
        if leftovers:
            break
    assert leftovers, "no writer was killed inside a write"
    # Fill the store past its cap: eviction must count the leftover and remove it.
    for i in range(8):
        store[f"live-{i}"] = value_for(f"live-{i}", size)
    assert not [p for p in leftovers if p.exists()], "a dead writer's temp file survived eviction"
    assert _disk_bytes(root) <= cap
    assert store.get("live-7") == value_for("live-7", size)
    store.close()


def _lock_files(root: Path) -> list[Path]:
    from kernelcache.stores.file.store import FORMAT_DIR

    return sorted(p for p in (root / FORMAT_DIR / "locks").glob("*.lock"))


@pytest.mark.parametrize("command", [("clear", "--yes"), ("prune", "--older-than", "1000d"), ("verify", "--fix")])
def test_maintenance_removes_lock_files_nobody_holds(tmp_path: Path, command: tuple[str, ...]) -> None:
    """locks/*.lock grow by one per key: clear, prune and verify --fix remove the idle ones
    and keep the one a live process holds (its holder still excludes every newcomer)."""
    from kernelcache.compile.flight import SingleFlight

    root = tmp_path / "cache"
    cache = FileStreamProgramCache(root)
    for i in range(5):
        with SingleFlight(bytes([i]) * 32, lock_path=cache.lock_path(f"{i:02x}" * 32 + ".lock")).hold() as outcome:
            assert outcome == "acquired"
    assert len(_lock_files(root)) == 5
    held_hex = "ee" * 32
    holder = _worker("hold_single_flight", str(root), held_hex, 60)
    assert json.loads(holder.stdout.readline())["outcome"] == "acquired"
    try:
        done = _cli(*command, "--cache-dir", str(root))
        assert done.returncode == 0, done.stderr
        assert [p.name for p in _lock_files(root)] == [held_hex + ".lock"]
        with SingleFlight(bytes.fromhex(held_hex), lock_path=cache.lock_path(held_hex + ".lock")).try_hold() as outcome:
            assert outcome == "busy"
    finally:
        holder.kill()
        holder.wait()
    cache.close()


def test_lock_files_removed_under_contention_never_make_two_holders(tmp_path: Path) -> None:
    """Processes take one key's lock over and over while another removes idle lock files in
    a tight loop: never two holders at once.

    Race provoked (stores/lockfiles.py): a locker opens k.lock, the remover locks and unlinks
    it, the locker's flock then succeeds on the unlinked file while a newcomer locks a fresh
    k.lock. The locker's identity check (fstat of its fd vs lstat of the path) catches it.
    """
    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    marker, stop = tmp_path / "inside", tmp_path / "stop"
    remover = _worker("remove_locks_until", str(root), str(stop))
    contenders = [_worker("contend", str(root), "cd" * 32, 250, str(marker)) for _ in range(4)]
    overlaps = sum(_result(c)["overlaps"] for c in contenders)
    stop.touch()
    removed = _result(remover)["removed"]
    assert removed > 0, "the remover never removed a lock file: the race was not exercised"
    assert overlaps == 0


def test_sweeping_never_takes_a_live_writers_staged_file(tmp_path: Path) -> None:
    """Writers stage 1 MB values (fsync'ed) while this process sweeps tmp/ in a tight loop:
    every *.tmp file is flocked by its writer from the moment it has that name until it is
    published, so the sweeper never takes one, and no write is dropped.

    Races provoked: a staged file looks like a dead writer's leftover while its writer is
    (1) between creating it and locking it (hence the born-as-*.new rename in stage_held:
    this test dropped writes under load without it), (2) writing it, (3) publishing it.
    """
    from kernelcache.stores.file.ops import sweep_dead_temps
    from kernelcache.stores.file.store import FORMAT_DIR

    root = tmp_path / "cache"
    FileStreamProgramCache(root).close()
    tmp = str(root / FORMAT_DIR / "tmp")
    size = 1 << 20
    writers = [_worker("write_keys", str(root), f"w{i}", 25, size) for i in range(3)]
    swept = sweeps = 0
    while any(w.poll() is None for w in writers):
        swept += len(sweep_dead_temps(tmp, float("inf")))
        sweeps += 1
    written: list[str] = []
    for w in writers:
        got = _result(w)
        assert got["dropped"] == 0
        written += got["written"]
    assert sweeps > 10
    assert swept == 0
    assert _lost(root, written, size) == []
