"""The sidecar: what a file store keeps next to each artifact, checked as a whole on every hit.

One header line the hit path parses without JSON, then the metadata as JSON::

    kernelcache-sidecar 1 <size> <crc32 hex> <sha256 hex> <created unix time>\\n{json}

The hit path checks size and CRC-32 (zlib, about twice as fast as SHA-256 here); the
SHA-256 is for tools (verify, export) and for users comparing artifacts across machines.
A sidecar of a format this version does not know is skipped, never judged.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from typing import Any

from kernelcache.stores.base import Meta

SIDECAR_FORMAT = 1
META_SUFFIX = ".meta"
_MAGIC = b"kernelcache-sidecar"
# A typical sidecar is a few hundred bytes; fileops.read_fd reads on past this if needed.
READ_SIZE = 1 << 16


def make_sidecar(payload: bytes, meta: Meta) -> bytes:
    """The sidecar of payload with this metadata, stamped with the current time."""
    head = b"%s %d %d %08x %s %.6f\n" % (
        _MAGIC,
        SIDECAR_FORMAT,
        len(payload),
        zlib.crc32(payload),
        hashlib.sha256(payload).hexdigest().encode(),
        time.time(),
    )
    return head + json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def _split(raw: bytes | None) -> tuple[list[bytes], bytes] | None:
    """(header fields, meta JSON) of a kernelcache sidecar, or None if it is not one."""
    if not raw:
        return None
    head, _, meta_json = raw.partition(b"\n")
    fields = head.split(b" ")
    if len(fields) < 6 or fields[0] != _MAGIC:
        return None
    return fields, meta_json


def parse_sidecar(raw: bytes | None) -> tuple[tuple[int, int] | None, bytes]:
    """((size, crc32), meta JSON) from a sidecar; (None, b"") if unusable, size -1 if unknown format."""
    split = _split(raw)
    if split is None:
        return None, b""
    fields, meta_json = split
    if fields[1] != b"%d" % SIDECAR_FORMAT:
        return (-1, 0), b""
    try:
        return (int(fields[2]), int(fields[3], 16)), meta_json
    except ValueError:
        return None, b""


def sidecar_info(raw: bytes) -> dict[str, Any] | None:
    """Everything a sidecar says, for tools: size, crc32, sha256, created, meta."""
    split = _split(raw)
    if split is None or split[0][1] != b"%d" % SIDECAR_FORMAT:
        return None
    fields, meta_json = split
    try:
        return {
            "size": int(fields[2]),
            "crc32": fields[3].decode(),
            "sha256": fields[4].decode(),
            "created": float(fields[5]),
            "meta": load_meta(meta_json),
        }
    except ValueError:
        return None


def load_meta(meta_json: bytes) -> Meta:
    """The metadata dict of a sidecar's JSON part; {} if it is not a JSON object."""
    try:
        meta = json.loads(meta_json) if meta_json else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}
