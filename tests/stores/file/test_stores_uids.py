"""The cache tree and real second users (issue 10 #13, issue 15 §1): attacks and a team cache.

Root creates the users and a group here; code runs as them in forked children (setgroups,
setgid, setuid, umask). Skipped when not root or without useradd.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pickle
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from uids import User, as_user, become, team

from kernelcache import FileStreamProgramCache, UnsafeCacheDirError
from kernelcache.compile.flight import SingleFlight
from kernelcache.stores.file.store import FORMAT_DIR

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create real second users",
)

_TEAM: dict[str, str] = {}  # the group's name of this run (uids.team), once the users fixture made it


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    """Members "a" and "b" of a group, and an outsider "c", named for this run alone."""
    with team("kctrust") as made:
        _TEAM["group"] = made.group
        a, b = made.members
        yield {"a": a, "b": b, "c": made.outsider}


def _group_gid() -> int:
    return grp.getgrnam(_TEAM["group"]).gr_gid


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory every user can enter and create in, like /tmp (sticky, world-writable)."""
    path = Path(tempfile.mkdtemp(prefix="kctrust-", dir="/tmp"))
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def in_background(user: User, fn: Callable[..., Any], *args: Any, umask: int = 0o077) -> Iterator[None]:
    """Run fn as user in a child for the duration of the with-block (it is waited for at the end)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            become(user, umask)
            fn(*args)
            code = 0
        finally:
            os._exit(code)
    try:
        yield
    finally:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


# -- issue 10 #13: the symlinked-root swap -------------------------------------------------------

GOOD, EVIL = b"the victim's own kernel", b"planted by another user"


def _victim_reads_through_link(link: str, opened: str, swapped: str) -> bytes | None:
    cache = FileStreamProgramCache(link)  # the ownership check passes: the link points home
    Path(opened).touch()
    _wait_for(Path(swapped))
    return cache.get("k")


def _plant(evil: str) -> None:
    cache = FileStreamProgramCache(evil)
    cache["k"] = EVIL
    cache.close()
    for dirpath, _dirs, files in os.walk(evil):
        os.chmod(dirpath, 0o755)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o644)


def _point(link: str, target: str) -> None:
    tmp = link + ".new"
    os.symlink(target, tmp)
    os.replace(tmp, link)  # atomic re-point, as an attacker would


def test_a_symlinked_root_cannot_be_swapped_under_a_live_store(users: dict[str, User], base: Path) -> None:
    """Another user points a symlinked root at the victim's own cache (the check passes),
    then re-points it at a tree with a planted artifact and a valid sidecar. The victim's
    store must keep using the directory it checked: the root is resolved once."""
    victim, attacker = users["a"], users["c"]
    home = base / "victim-cache"

    def fill() -> None:
        FileStreamProgramCache(home)["k"] = GOOD

    as_user(victim, fill)
    as_user(attacker, _plant, str(base / "evil"))
    link = str(base / "link")
    as_user(attacker, _point, link, str(home))
    opened, swapped = base / "opened", base / "swapped"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups(list(victim.groups))
            os.setgid(victim.gid)
            os.setuid(victim.uid)
            warnings.simplefilter("ignore")
            got = _victim_reads_through_link(link, str(opened), str(swapped))
            os.write(write_end, pickle.dumps(got))
        finally:
            os._exit(0)
    os.close(write_end)
    _wait_for(opened)
    as_user(attacker, _point, link, str(base / "evil"))
    swapped.touch()
    with os.fdopen(read_end, "rb") as f:
        got = pickle.loads(f.read())
    os.waitpid(pid, 0)
    assert got == GOOD


# -- issue 10 #13: every directory of the tree is checked ------------------------------------


def test_private_mode_checks_every_directory_of_the_tree(users: dict[str, User], tmp_path: Path) -> None:
    """A subdirectory that others can write, that another uid owns, or that is a symlink is
    refused (before: only the root was looked at)."""
    other = users["c"]
    root = tmp_path / "cache"
    FileStreamProgramCache(root)["k"] = b"v"
    entries = root / FORMAT_DIR / "entries"
    shard = next(entries.iterdir())

    os.chmod(entries, 0o777)
    with pytest.raises(UnsafeCacheDirError, match="entries.*writable by others"):
        FileStreamProgramCache(root)
    os.chmod(entries, 0o700)

    os.chown(root / FORMAT_DIR, other.uid, other.gid)
    with pytest.raises(UnsafeCacheDirError, match=f"owned by uid {other.uid}"):
        FileStreamProgramCache(root)
    os.chown(root / FORMAT_DIR, 0, 0)

    os.chmod(shard, 0o770)
    with pytest.raises(UnsafeCacheDirError, match="writable by group"):
        FileStreamProgramCache(root)
    os.chmod(shard, 0o700)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    shutil.rmtree(root / FORMAT_DIR / "tmp")
    os.symlink(elsewhere, root / FORMAT_DIR / "tmp")
    with pytest.raises(UnsafeCacheDirError, match="symlink"):
        FileStreamProgramCache(root)
    os.unlink(root / FORMAT_DIR / "tmp")

    assert FileStreamProgramCache(root).get("k") == b"v"


# -- issue 15 §1: a team cache for two real members --------------------------------------------


def _team_dir(base: Path) -> Path:
    team = base / "team"
    team.mkdir()
    os.chown(team, 0, _group_gid())
    os.chmod(team, 0o2770)
    return team


def _write(root: str, cap: int | None, items: dict[str, bytes]) -> dict[str, Any]:
    cache = FileStreamProgramCache(root, cap, allow_shared=True)
    for k, v in items.items():
        cache[k] = v
    out = cache.stats()
    cache.close()
    return out


def _read(root: str, keys: list[str]) -> dict[str, bytes | None]:
    cache = FileStreamProgramCache(root, allow_shared=True)
    out = {k: cache.get(k) for k in keys}
    cache.close()
    return out


def _stats(root: str) -> dict[str, Any]:
    cache = FileStreamProgramCache(root, allow_shared=True)
    out = cache.stats()
    cache.close()
    return out


def _hold_key(root: str, key_hex: str, held: str, release: str) -> None:
    cache = FileStreamProgramCache(root, allow_shared=True)
    with SingleFlight(bytes.fromhex(key_hex), lock_path=cache.lock_path(key_hex + ".lock")).hold() as outcome:
        assert outcome == "acquired"
        Path(held).touch()
        _wait_for(Path(release))


def _try_key(root: str, key_hex: str) -> str:
    cache = FileStreamProgramCache(root, allow_shared=True)
    with SingleFlight(bytes.fromhex(key_hex), lock_path=cache.lock_path(key_hex + ".lock")).try_hold() as outcome:
        return outcome


def test_team_cache_serves_every_member(users: dict[str, User], base: Path) -> None:
    """Member A writes (umask 002), member B (umask 022) reads A's entries, writes its own,
    evicts A's under the cap, shares the counters and the single-flight locks."""
    a, b = users["a"], users["b"]
    team = str(_team_dir(base))
    value = {f"a{i}": bytes([i]) * 4000 for i in range(4)}
    as_user(a, _write, team, 40_000, value, umask=0o002)
    assert as_user(b, _read, team, list(value), umask=0o022) == value

    mine = {f"b{i}": bytes([100 + i]) * 4000 for i in range(9)}
    after = as_user(b, _write, team, 40_000, mine, umask=0o022)
    assert after["evictions"] >= 1  # B removed A's least recently used entries
    got = as_user(a, _read, team, [*value, *mine], umask=0o002)
    assert got["b8"] == mine["b8"]
    assert got["a0"] is None  # evicted by B: A's entries are B's to evict under the cap
    shared = as_user(a, _stats, team)
    assert shared["hits"] >= 4 + 1  # B's four hits and A's own, in one shared file
    assert shared["stores"] == 4 + 9

    held, release = base / "held", base / "release"
    key_hex = "ab" * 32
    # A's umask lets nobody read what A creates: the lock file is still opened by B (flock
    # needs read access only, and a team cache gives the group that much).
    with in_background(a, _hold_key, team, key_hex, str(held), str(release), umask=0o077):
        _wait_for(held)
        assert as_user(b, _try_key, team, key_hex, umask=0o022) == "busy"
        release.touch()
    assert as_user(b, _try_key, team, key_hex, umask=0o022) == "acquired"

    # the tree the two members built: setgid, group-writable, the team's group everywhere
    gid = _group_gid()
    for dirpath, _dirs, _files in os.walk(team):
        st = os.lstat(dirpath)
        assert st.st_mode & 0o2070 == 0o2070 and st.st_gid == gid, dirpath
        assert not st.st_mode & 0o002, dirpath


def test_team_mode_refuses_what_the_team_does_not_own(users: dict[str, User], base: Path) -> None:
    """A team cache still refuses a directory others can write, or that an outsider owns."""
    a, outsider = users["a"], users["c"]
    team = _team_dir(base)
    as_user(a, _write, str(team), None, {"k": b"v"}, umask=0o002)
    entries = team / FORMAT_DIR / "entries"
    os.chmod(entries, 0o2777)
    with pytest.raises(UnsafeCacheDirError, match="writable by others"):
        as_user(a, _read, str(team), ["k"], umask=0o002)
    os.chmod(entries, 0o2770)
    shard = next(entries.iterdir())
    os.chown(shard, outsider.uid, _group_gid())
    with pytest.raises(UnsafeCacheDirError, match=f"owned by uid {outsider.uid}, who is not a member"):
        as_user(a, _read, str(team), ["k"], umask=0o002)
    os.chown(shard, a.uid, _group_gid())
    assert as_user(a, _read, str(team), ["k"], umask=0o002) == {"k": b"v"}


def _import_all_of_kernelcache() -> None:
    """Import every module of the package (those whose extra is missing are skipped)."""
    import importlib
    import pkgutil

    import kernelcache

    for module in pkgutil.walk_packages(kernelcache.__path__, "kernelcache."):
        if module.name.endswith(".__main__"):
            continue  # it runs the command
        with contextlib.suppress(ImportError):
            importlib.import_module(module.name)


def _cli(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The kernelcache command run in this (forked, already switched) process: (exit code, output)."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from kernelcache.cli.main import main

    os.environ.update(env)
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        try:
            main(argv, standalone_mode=False)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        except Exception as exc:  # click's exceptions carry their exit code
            code = getattr(exc, "exit_code", 1)
            out.write(str(exc))
    return code, out.getvalue()


def test_every_command_opens_a_team_cache_for_a_second_member(users: dict[str, User], base: Path) -> None:
    """--allow-shared (or KERNELCACHE_ALLOW_SHARED=1) opens the team cache A made, for B."""
    # The children may be unable to read this interpreter's site-packages (under root's 0700
    # home) and this checkout (a clone in a 0700 directory): every module of kernelcache is
    # imported before forking, and --json asks for no rich tables.
    _import_all_of_kernelcache()

    a, b = users["a"], users["b"]
    team = str(_team_dir(base))
    as_user(a, _write, team, None, {"k": b"v" * 100}, umask=0o002)
    for argv, env in (
        (["ls", "--json", "--allow-shared", "--cache-dir", team], {}),
        (["stats", "--json", "--cache-dir", team], {"KERNELCACHE_ALLOW_SHARED": "1"}),
        (["verify", "--fix", "--json", "--allow-shared", "--cache-dir", team], {}),
        (["prune", "--older-than", "1000d", "--json", "--allow-shared", "--cache-dir", team], {}),
    ):
        code, out = as_user(b, _cli, argv, env, umask=0o022)
        assert code == 0, (argv, out)
    code, out = as_user(b, _cli, ["ls", "--json", "--cache-dir", team], {}, umask=0o022)
    assert code != 0 and "allow_shared" in out
    assert as_user(a, _read, team, ["k"], umask=0o002) == {"k": b"v" * 100}
