"""One Triton group (a compiled kernel's files) as one record: payload and metadata.

The payload is the members' bytes, concatenated in the order of their names; the record's
metadata names each member with its size (``"members": {name: size}``, which ``kernelcache
show`` lists too). The record is checked as a whole by the store that serves it (a file
entry's sidecar covers payload and metadata; so does a Redis or object-store record's
checksum), so the members come back together or not at all: no member can be evicted,
rewritten or lost apart from the others. ``unpack`` accepts only a record whose every byte
is accounted for by plain member names and sizes; anything else is None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["pack", "unpack"]


def pack(members: dict[str, bytes]) -> tuple[bytes, dict[str, int]]:
    """The payload holding ``members`` (name -> bytes), and the sizes its metadata names."""
    names = sorted(members)
    return b"".join(members[name] for name in names), {name: len(members[name]) for name in names}


def unpack(payload: bytes, meta: Any, is_plain: Callable[[object], bool]) -> dict[str, bytes] | None:
    """The members of a group record; None when it is not exactly one packed group.

    ``is_plain(name)`` decides which member names are acceptable (plain file names).
    """
    sizes = meta.get("members") if isinstance(meta, dict) and meta.get("kind") == "triton-group" else None
    if not isinstance(sizes, dict):
        return None
    members: dict[str, bytes] = {}
    offset = 0
    for name in sorted(sizes):
        size = sizes[name]
        if not is_plain(name) or type(size) is not int or size < 0:
            return None
        members[name] = payload[offset : offset + size]
        offset += size
    return members if offset == len(payload) else None
