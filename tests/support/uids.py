"""Real second users for the tests that need them: a group, members and an outsider, made by root
with names unique to this run (two runs of the suite on one machine never share or remove each
other's users), removed afterwards; and code run as one of them in a forked child."""

from __future__ import annotations

import contextlib
import os
import pickle
import pwd
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

NEEDS_ROOT = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create real second users",
)


RUN = uuid.uuid4().hex[:6]


def unique(name: str) -> str:
    """``name`` with this run's suffix, for a fixture that makes one user or group of its own
    (names stay within useradd's 32 characters)."""
    out = f"{name}_{RUN}"
    assert len(out) <= 32, out
    return out


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Team:
    group: str
    gid: int
    members: tuple[User, ...]
    outsider: User


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@contextlib.contextmanager
def team(prefix: str, members: int = 2) -> Iterator[Team]:
    """A group ``<prefix><run>`` with ``members`` users in it and one user outside it (names
    ``<prefix><run>_<i>``, under 32 characters), removed again at the end."""
    run = uuid.uuid4().hex[:6]
    group = f"{prefix}{run}"
    names = [f"{prefix}{run}_{i}" for i in range(members)]
    outsider = f"{prefix}{run}_x"
    made: list[str] = []
    try:
        _run("groupadd", group)
        for name in names:
            _run("useradd", "-M", "-N", "-g", group, "-s", "/usr/sbin/nologin", name)
            made.append(name)
        _run("useradd", "-M", "-N", "-s", "/usr/sbin/nologin", outsider)
        made.append(outsider)
        users = []
        for name in made:
            pw = pwd.getpwnam(name)
            users.append(User(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid))))
        import grp

        yield Team(group, grp.getgrnam(group).gr_gid, tuple(users[:-1]), users[-1])
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", group], capture_output=True)


def become(user: User, umask: int) -> None:
    """In a forked child: drop to ``user`` (its groups, gid, uid) with ``umask``."""
    os.setgroups(list(user.groups))
    os.setgid(user.gid)
    os.setuid(user.uid)
    os.umask(umask)
    warnings.simplefilter("ignore")


def as_user(user: User, fn: Callable[..., Any], *args: Any, umask: int = 0o077) -> Any:
    """fn(*args) run in a forked child as user; its result, or its exception raised here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read_end)
            become(user, umask)
            try:
                result: Any = ("ok", fn(*args))
            except BaseException as exc:  # reported to the parent, raised there
                result = ("error", exc)
            with os.fdopen(write_end, "wb") as f:
                pickle.dump(result, f)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value
