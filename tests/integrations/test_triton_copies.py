"""Where kernelcache.triton puts the copies it hands to Triton, with real second users: never
under a directory the store refused, never in a directory another user can write, readable
by a team's members. (CPU only; needs root and useradd for the second users.)"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest

pytest.importorskip("triton")

from redis_servers import RedisServer, need_redis  # noqa: E402

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create real second users",
)

from helpers import REPO  # noqa: E402

SRC = os.path.join(REPO, "src")
KEY = "ab" * 32
NAMES = ("kern.cubin", "kern.json")

# One Triton cache call in a fresh process: put (then group) or get a group, put-file or
# get-file single files; prints the paths handed out and what they hold (read while it runs:
# a group's copies are this process's scratch copies, removed at its exit).
WORKER = r"""
import json, os, sys
from triton.runtime.cache import get_cache_manager
cmd, key, names = sys.argv[1], sys.argv[2], sys.argv[3:]
manager = get_cache_manager(key)
if cmd == "put":
    paths = {n: manager.put(f"v1:{n}".encode(), n) for n in names}
    manager.put_group("kern.json", paths)
elif cmd == "get":
    paths = manager.get_group("kern.json")
elif cmd == "put-file":
    paths = {n: manager.put(f"v1:{n}".encode(), n) for n in names}
else:
    paths = {n: manager.get_file(n) for n in names}
contents = {n: open(p, "rb").read().decode() for n, p in (paths or {}).items()}
folders = sorted({os.path.dirname(p) for p in (paths or {}).values()})
modes = {}
for folder in folders:
    while folder != os.path.dirname(folder):
        st = os.lstat(folder)
        modes[folder] = [st.st_uid, st.st_mode]
        folder = os.path.dirname(folder)
print(json.dumps({"paths": paths, "contents": contents, "folders": modes}))
"""


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Two team members ("a", "b") and an outsider ("x"), named for this run alone (uids.team),
    and the team's group name ("team")."""
    from uids import team

    with team("kcinteg") as made:
        a, b = made.members
        yield {
            "a": pwd.getpwnam(a.name),
            "b": pwd.getpwnam(b.name),
            "x": pwd.getpwnam(made.outsider.name),
            "team": made.group,
        }  # type: ignore[dict-item]


@pytest.fixture
def base() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="kcinteg-", dir="/tmp")  # every user can reach it
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _clean_env(env: dict[str, str]) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KERNELCACHE_", "TRITON_", "XDG_"))},
        "PYTHONPATH": SRC,
        "TRITON_CACHE_MANAGER": "kernelcache.triton:KernelCacheManager",
        **env,
    }


def _triton(env: dict[str, str], *args: str, user: pwd.struct_passwd | None = None, umask: int = 0o007) -> dict:
    """The worker in a fresh process; as ``user`` it runs in a forked child that drops to
    that uid (a team member's umask, 007 unless told): the interpreter's own directory may be closed to
    other users."""
    if user is None:
        out = subprocess.run(
            [sys.executable, "-c", WORKER, *args], env=_clean_env(env), capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing of kernelcache is imported before the uid is dropped
        status = 1
        try:
            os.close(read_end)
            os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.umask(umask)
            signal.alarm(60)  # a call that hangs fails the test instead of hanging it
            os.environ.clear()
            os.environ.update(_clean_env(env))
            sys.stdout = os.fdopen(write_end, "w")
            sys.argv = ["worker", *args]
            exec(compile(WORKER, "worker", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, text
    return json.loads(text.strip().splitlines()[-1])


def _inside(path: str, folder: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)


@pytest.fixture
def refused(base) -> Iterator[tuple[str, RedisServer]]:
    """An other-writable KERNELCACHE_DIR (the store refuses its disk tier) and a Redis."""
    need_redis()
    server = RedisServer(base)
    shared = os.path.join(base, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    try:
        yield shared, server
    finally:
        server.stop()


def test_copies_never_go_under_a_directory_the_store_refused(users, base, refused):
    # KERNELCACHE_DIR is other-writable, so the store refuses its disk tier and runs on
    # memory -> Redis. An outsider plants the tree the copies would land in, then swaps
    # whatever appears there: nothing handed out may live there, and what is read is ours.
    shared, server = refused
    outsider = users["x"]
    planted = os.path.join(shared, "materialized")
    subprocess.run(["mkdir", "-p", "-m", "777", planted], check=True, user=outsider.pw_uid)
    victim_tmp = os.path.join(base, "victim-tmp")
    os.mkdir(victim_tmp, 0o700)
    env = {"KERNELCACHE_DIR": shared, "KERNELCACHE_REDIS_URL": server.url, "TMPDIR": victim_tmp}
    put = _triton(env, "put", KEY, *NAMES)
    got = _triton(env, "get", KEY, *NAMES)
    assert got["contents"] == {n: f"v1:{n}" for n in NAMES}  # the group came back over Redis
    for path in [*put["paths"].values(), *got["paths"].values()]:
        assert not _inside(path, shared), path
    for folder, (uid, mode) in {**put["folders"], **got["folders"]}.items():
        if _inside(folder, victim_tmp):  # every directory up to the private root is ours alone
            assert uid == os.geteuid() and not mode & 0o022, (folder, oct(mode))
    # Nothing of ours appeared in the refused directory, so there is nothing to swap.
    mine = [os.path.join(d, f) for d, _, fs in os.walk(shared) for f in fs]
    assert [p for p in mine if os.lstat(p).st_uid == os.geteuid()] == []
    assert sorted(os.listdir(shared)) == ["materialized"] and os.listdir(planted) == []


def test_a_private_copy_directory_someone_else_planted_is_refused(users, base, refused):
    # The per-user directory lives under the temp dir, where anyone can create it first.
    shared, server = refused
    tmp = os.path.join(base, "tmp")
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    squat = os.path.join(tmp, f"kernelcache-{os.geteuid()}")
    subprocess.run(["mkdir", "-m", "777", squat], check=True, user=users["x"].pw_uid)
    env = {"KERNELCACHE_DIR": shared, "KERNELCACHE_REDIS_URL": server.url, "TMPDIR": tmp}
    put = _triton(env, "put", KEY, *NAMES)
    # Triton still gets working paths (its own cache directory), none in the squatted one.
    assert put["contents"] == {n: f"v1:{n}" for n in NAMES}
    assert all(not _inside(p, squat) and not _inside(p, shared) for p in put["paths"].values())
    assert os.listdir(squat) == []


def _team_cache(base: str, owner, group: str) -> tuple[str, dict[str, str]]:  # noqa: ANN001 - a pwd entry
    """A team cache directory (the team's group, setgid, 2770) owned by ``owner``, and its env."""
    team = os.path.join(base, "team")
    os.mkdir(team)
    os.chown(team, owner.pw_uid, grp.getgrnam(group).gr_gid)
    os.chmod(team, 0o2770)
    return team, {"KERNELCACHE_DIR": team, "KERNELCACHE_ALLOW_SHARED": "1"}


def test_team_members_read_each_others_copies(users, base):
    a, b = users["a"], users["b"]
    team, env = _team_cache(base, a, users["team"])
    expected = {n: f"v1:{n}" for n in NAMES}
    # A group a stored: b reads it (its copies are b's own scratch copies, gone at its exit).
    assert _triton(env, "put", KEY, *NAMES, user=a)["contents"] == expected
    assert _triton(env, "get", KEY, *NAMES, user=b)["contents"] == expected
    # Single files (launchers): one shared copy per content, which b reads instead of
    # replacing it with a file of its own.
    files = ("launcher.cpython-311-x86_64-linux-gnu.so",)
    _triton(env, "put-file", KEY, *files, user=a)
    first = _triton(env, "get-file", KEY, *files, user=a)
    second = _triton(env, "get-file", KEY, *files, user=b)
    assert first["contents"] == second["contents"] == {n: f"v1:{n}" for n in files}
    assert second["paths"] == first["paths"]
    for path in first["paths"].values():
        st = os.stat(path)
        assert st.st_uid == a.pw_uid and st.st_mode & stat.S_IRGRP, oct(st.st_mode)


def _as(user: pwd.struct_passwd, *paths_to_fifos: str) -> None:
    """As ``user`` (in a forked child): replace each file with a FIFO of the same name."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            for path in paths_to_fifos:
                if os.path.lexists(path):
                    os.unlink(path)
                os.mkfifo(path)
                os.chmod(path, 0o660)  # whatever the umask: the team reads and writes it
                os.utime(path, (0, 0))  # old: what waits on it is due at once
            status = 0
        finally:
            os._exit(status)
    assert os.waitpid(pid, 0)[1] == 0


def test_a_fifo_a_member_planted_for_a_copy_never_hangs_another(users, base):
    # The team's copy folders are the team's to write: b swaps the shared copy of a
    # launcher (its name, digest included, is there to read) for a FIFO. Opening a FIFO to
    # read waits for a writer that never comes; a's next get_file must not wait on it.
    a, b = users["a"], users["b"]
    team, env = _team_cache(base, a, users["team"])
    files = ("launcher.cpython-311-x86_64-linux-gnu.so",)
    _triton(env, "put-file", KEY, *files, user=a)
    first = _triton(env, "get-file", KEY, *files, user=a)
    _as(b, *first["paths"].values())
    again = _triton(env, "get-file", KEY, *files, user=a)
    assert again["contents"] == first["contents"] == {n: f"v1:{n}" for n in files}


def test_a_fifo_a_member_planted_for_the_sweep_stamp_never_hangs_another(users, base):
    # The same with the file whose mtime says when copies were last swept: a FIFO there,
    # old enough that the next copy written is due to sweep (and so to touch the stamp).
    a, b = users["a"], users["b"]
    team, env = _team_cache(base, a, users["team"])
    files = ("launcher.cpython-311-x86_64-linux-gnu.so",)
    _triton(env, "put-file", KEY, *files, user=a)
    _as(b, os.path.join(team, "materialized", ".swept"))
    again = _triton(env, "get", KEY, *NAMES, user=a)  # a miss; then a copy written
    assert again["paths"] is None
    written = _triton(env, "put-file", "cd" * 32, *files, user=a)
    assert written["contents"] == {n: f"v1:{n}" for n in files}


def test_members_with_umask_022_still_get_each_others_single_files(users, base):
    # Under umask 022 a member's entries (and so the shared copies linked to them) are
    # 0644: another member cannot mark such a copy as handed out (utime needs write access).
    # It then gets a copy of its own, not a miss (and a launcher built again).
    a, b = users["a"], users["b"]
    team, env = _team_cache(base, a, users["team"])
    files = ("launcher.cpython-311-x86_64-linux-gnu.so",)
    _triton(env, "put-file", KEY, *files, user=a, umask=0o022)
    first = _triton(env, "get-file", KEY, *files, user=a, umask=0o022)
    assert not os.stat(first["paths"][files[0]]).st_mode & stat.S_IWGRP
    second = _triton(env, "get-file", KEY, *files, user=b, umask=0o022)
    assert second["contents"] == first["contents"] == {n: f"v1:{n}" for n in files}
