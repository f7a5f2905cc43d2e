"""Names for the real users and groups the tests create as root.

Each test run names its own (a random suffix per process), so two runs of the suite on one machine
at once never delete or reuse each other's users; each fixture removes what it created.
"""

from __future__ import annotations

import os
import pickle
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RUN = uuid.uuid4().hex[:6]


def unique(name: str) -> str:
    """``name`` with this run's suffix (user and group names stay within useradd's 32 characters)."""
    out = f"{name}_{RUN}"
    assert len(out) <= 32, out
    return out


@dataclass(frozen=True)
class User:
    """A real user the tests created: its name, uid, primary gid and every group it is in."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def as_user(user: User, fn: Callable[..., Any], *args: Any, umask: int = 0o077) -> Any:
    """fn(*args) run in a forked child as user; its result, or its exception raised here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(read_end)
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            os.umask(umask)
            warnings.simplefilter("ignore")
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
