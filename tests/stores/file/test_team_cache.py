"""A team cache is governed by its directory, for every member alike: one member's own cap never
evicts the team's entries, every member's use keeps an entry young, and --allow-shared never
changes the mode of a directory that exists. Real second users (made by root, tests/support/uids.py)
in forked children, real files."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from uids import NEEDS_ROOT, Team, as_user, team

from kernelcache import FileStreamProgramCache, KernelCacheWarning, UnsafeCacheDirError
from kernelcache.stores.file import dircap


@pytest.fixture(scope="module")
def members() -> Iterator[Team]:
    with team("kcteam") as made:
        yield made


@pytest.fixture
def team_dir(members: Team) -> Iterator[str]:
    """A team cache directory as `kernelcache init --team` makes it (root:group, 2770), in a
    directory every user can enter."""
    base = tempfile.mkdtemp(prefix="kcteam-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "team")
    os.mkdir(root)
    os.chown(root, 0, members.gid)
    os.chmod(root, 0o2770)
    try:
        yield root
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _put(root: str, env: dict[str, str], items: dict[str, bytes]) -> dict[str, object]:
    """In a member's process: store ``items`` through the default cache configured by ``env``."""
    os.environ.update(env)
    from kernelcache.stores.default import default_cache

    cache = default_cache()
    for key, value in items.items():
        cache[key] = value
    return {"cap": cache.max_size_bytes, "source": dircap.cap_for(root)[1], "entries": len(cache)}


def _get(root: str, keys: list[str]) -> dict[str, bool]:
    with FileStreamProgramCache(root, allow_shared=True) as cache:
        return {key: cache.get(key) is not None for key in keys}


def _names(root: str) -> set[str]:
    with FileStreamProgramCache(root, allow_shared=True) as cache:
        return {e.name for e in cache.iter_entries()}


@NEEDS_ROOT
def test_a_members_own_cap_never_evicts_the_teams_entries(members: Team, team_dir: str) -> None:
    """The directory's cap (200 MB, set once) governs the team cache: member B running with
    KERNELCACHE_MAX_SIZE=6KB stores its entries beside A's and evicts none of them; both see the
    directory's cap and where it comes from."""
    a, b = members.members
    dircap.write(team_dir, "200MB", shared=True)
    shared = {"KERNELCACHE_DIR": team_dir, "KERNELCACHE_ALLOW_SHARED": "1"}
    seen_a = as_user(a, _put, team_dir, shared, {f"a{i}": bytes([i]) * 4000 for i in range(4)}, umask=0o002)
    mine = {**shared, "KERNELCACHE_MAX_SIZE": "6KB"}
    seen_b = as_user(b, _put, team_dir, mine, {f"b{i}": bytes([9 + i]) * 4000 for i in range(2)}, umask=0o022)
    assert seen_a["cap"] == seen_b["cap"] == 200 * 10**6
    assert "team cache directory" in str(seen_b["source"]) and "private tiers only" in str(seen_b["source"])
    assert as_user(a, _get, team_dir, [f"a{i}" for i in range(4)]) == {f"a{i}": True for i in range(4)}
    assert seen_b["entries"] == 6


def _read_repeatedly(root: str, key: str) -> bool:
    with FileStreamProgramCache(root, allow_shared=True) as cache:
        return all(cache.get(key) is not None for _ in range(3))


def _evict_for(root: str, cap: int, key: str) -> None:
    with FileStreamProgramCache(root, cap, allow_shared=True) as cache:
        cache[key] = b"n" * 4000


def _write_then_read_in_order(root: str, keys: list[str]) -> None:
    """Store the keys, then read each once in order: the LRU order is theirs, and each entry's
    atime is past its mtime and ctime (a relatime mount leaves such an atime alone on a read for
    a day: the kernel does not stamp a later read for us)."""
    with FileStreamProgramCache(root, allow_shared=True) as cache:
        for key in keys:
            cache[key] = key.encode() * 1000
        for key in keys:
            time.sleep(0.02)
            assert cache.get(key) is not None


@NEEDS_ROOT
@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_another_members_reads_keep_an_entry_young(members: Team, team_dir: str, umask: int) -> None:
    """A writes four entries (umask 022: its files are not group-writable); the oldest is the one
    B uses. Evicting for room (any member) takes the least recently used by anyone: B's reads
    kept A's oldest entry. Before, a read by someone else than the file's owner could not move
    its LRU time (utime with explicit times needs the owner; the error was dropped)."""
    a, b = members.members
    keys = [f"k{i}" for i in range(4)]
    as_user(a, _write_then_read_in_order, team_dir, keys, umask=umask)
    from kernelcache.stores.naming import entry_name

    names = {k: entry_name(k.encode()) for k in keys}
    time.sleep(1.1)  # past the granularity of last-use stamps (one a second per entry)
    assert as_user(b, _read_repeatedly, team_dir, "k0", umask=0o022)
    # Room for two more of these entries under a cap that holds about four: the two least
    # recently used go (k1 and k2), never k0, which B just read.
    as_user(a, _evict_for, team_dir, 4 * 2300 + 100, "new", umask=umask)
    left = _names(team_dir)
    assert names["k0"] in left and names["k3"] in left, sorted(left)
    assert names["k1"] not in left


def test_allow_shared_never_changes_the_mode_of_a_directory_that_exists(tmp_path: Path) -> None:
    """--allow-shared on an existing 755 directory of notes: used as a private cache, its mode kept,
    one warning saying how to make a team cache; on a 777 one: refused, its mode kept (before: it
    was made drwxrwsr-x, and the 777 one got setgid and was refused anyway)."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("x")
    os.chmod(notes, 0o755)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FileStreamProgramCache(notes, allow_shared=True) as cache:
            cache["k"] = b"v"
            assert not cache.team
    assert stat.S_IMODE(os.stat(notes).st_mode) == 0o755
    said = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
    assert len(said) == 1 and "kernelcache init --team" in said[0] and "leaves its mode" in said[0]
    everyone = tmp_path / "everyone"
    everyone.mkdir()
    os.chmod(everyone, 0o777)
    with pytest.raises(UnsafeCacheDirError, match="kernelcache init --team"):
        FileStreamProgramCache(everyone, allow_shared=True)
    assert stat.S_IMODE(os.stat(everyone).st_mode) == 0o777 and os.listdir(everyone) == []
    made = tmp_path / "new-team"  # a directory the store makes itself is made a team root
    with FileStreamProgramCache(made, allow_shared=True) as cache:
        assert cache.team and stat.S_IMODE(os.stat(made).st_mode) == 0o2770
