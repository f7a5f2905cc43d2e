"""The sidecar: what a file store keeps next to each artifact, checked as a whole on every hit.

One header line the hit path parses without JSON, then the metadata as JSON::

    kernelcache-sidecar 2 <check> <size> <crc32 hex> <sha256 hex> <created unix time>\\n{json}

``<check>`` is the CRC-32 (8 hex digits) of every byte after it: the rest of the header AND
the metadata. The metadata decides what runs (the symbol mapping picks the kernel a name
expression loads), so it is verified on every hit, exactly like the artifact: a bit flip or
a truncation anywhere in the sidecar makes the entry a miss. Format 1 (layout v1) checked
the artifact only.

The hit path checks ``<check>``, then size and CRC-32 of the artifact (zlib, about twice as
fast as SHA-256 here); the SHA-256 is for tools (verify, export) and for users comparing
artifacts across machines. A sidecar of a format this version does not know is skipped,
never judged.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from typing import Any

from kernelcache.stores.base import Meta

SIDECAR_FORMAT = 2
META_SUFFIX = ".meta"
_MAGIC = b"kernelcache-sidecar"
_PREFIX = b"%s %d " % (_MAGIC, SIDECAR_FORMAT)
_CHECK_LEN = 8  # hex digits of the CRC-32, then one space
# A sidecar larger than this is not one of ours (a typical one is a few hundred bytes; a long
# compile log a few hundred kB): a reader does not read it, the entry is a miss.
MAX_SIZE = 64 << 20


def is_entry_file_name(name: str) -> bool:
    """Whether name is one a store gives its files in a shard: an entry name or its sidecar's."""
    base = name[: -len(META_SUFFIX)] if name.endswith(META_SUFFIX) else name
    return len(base) == 64 and all(c in "0123456789abcdef" for c in base)


def make_sidecar(payload: bytes, meta: Meta) -> bytes:
    """The sidecar of payload with this metadata, stamped with the current time."""
    body = (
        b"%d %08x %s %.6f\n"
        % (
            len(payload),
            zlib.crc32(payload),
            hashlib.sha256(payload).hexdigest().encode(),
            time.time(),
        )
        + json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    )
    return b"%s%08x %s" % (_PREFIX, zlib.crc32(body), body)


def _body(raw: bytes | None) -> bytes | None:
    """The checked part of a sidecar of this format, or None (damaged, or not this format)."""
    if not raw or not raw.startswith(_PREFIX):
        return None
    start = len(_PREFIX) + _CHECK_LEN + 1
    try:
        check = int(raw[len(_PREFIX) : start - 1], 16)
    except ValueError:
        return None
    body = raw[start:]
    return body if zlib.crc32(body) == check and raw[start - 1 : start] == b" " else None


def is_other_format(raw: bytes | None) -> bool:
    """A kernelcache sidecar of another format (not this version's to judge)."""
    return bool(raw) and raw.startswith(_MAGIC + b" ") and not raw.startswith(_PREFIX)  # type: ignore[union-attr]


def parse_sidecar(raw: bytes | None) -> tuple[tuple[int, int] | None, Meta | None]:
    """((size, crc32), meta) from a sidecar that passes its check.

    (None, None) if it is damaged or not a sidecar; size -1 if it is of another format.
    """
    if is_other_format(raw):
        return (-1, 0), None
    body = _body(raw)
    if body is None:
        return None, None
    head, _, meta_json = body.partition(b"\n")
    fields = head.split(b" ")
    meta = load_meta(meta_json)
    if len(fields) != 4 or meta is None:
        return None, None
    try:
        return (int(fields[0]), int(fields[1], 16)), meta
    except ValueError:
        return None, None


def sidecar_info(raw: bytes) -> dict[str, Any] | None:
    """Everything a sidecar says, for tools: size, crc32, sha256, created, meta.

    None if it fails its check (tampered, truncated) or is not of this format.
    """
    body = _body(raw)
    if body is None:
        return None
    head, _, meta_json = body.partition(b"\n")
    fields = head.split(b" ")
    meta = load_meta(meta_json)
    if len(fields) != 4 or meta is None:
        return None
    try:
        return {
            "size": int(fields[0]),
            "crc32": fields[1].decode(),
            "sha256": fields[2].decode(),
            "created": float(fields[3]),
            "meta": meta,
        }
    except ValueError:
        return None


def load_meta(meta_json: bytes) -> Meta | None:
    """The metadata dict of a sidecar's JSON part; None if it is not a JSON object."""
    try:
        meta = json.loads(meta_json) if meta_json else {}
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None
