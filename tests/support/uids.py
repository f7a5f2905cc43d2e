"""Names for the real users and groups the tests create as root.

Each test run names its own (a random suffix per process), so two runs of the suite on one machine
at once never delete or reuse each other's users; each fixture removes what it created.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

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
