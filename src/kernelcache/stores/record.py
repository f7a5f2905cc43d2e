"""The record format: one entry as one byte string, artifact and metadata checked as one.

Redis stores a record as one string, a bundle as one slice of its file, the object store as
one object; each passes the name it stores the record under as ``name`` (the Redis key name,
the entry's name in a bundle).

::

    b"KCR2" | flags (1 byte) | key id (8 bytes) | u32 head length | head JSON | payload | tag (32 bytes)

The head JSON holds the metadata (``{"size", "created", "meta"}``). The tag covers the
record's name and every byte before it, so the metadata that chooses the kernel (symbol
mapping, log, toolchain) is verified on every hit, not only the payload:

* unsigned (flags 0, key id zeros): tag = SHA-256(name, NUL, record);
* signed (flags 1): tag = HMAC-SHA256(secret, name, NUL, record), and the key id is a
  fingerprint of the secret (an HMAC of a constant: it reveals nothing about the secret).

The key id is what lets a reader tell "signed with another secret" (not ours to judge:
a miss, never deleted, never overwritten) from "damaged" (our own secret, a tag that does
not match: provably broken, removed by a writer). Records of the first format
(``KCR1``: only the payload was checked) are a plain miss, replaced by the next write.
"""

from __future__ import annotations

import enum
import hashlib
import json
import struct
import time
from typing import Any

MAGIC = b"KCR2"
OLD_MAGICS = (b"KCR1",)
_SIGNED = 1
_HEAD = struct.Struct("<4sB8sI")  # magic, flags, key id, head length
PREFIX_SIZE = 13  # magic + flags + key id: who wrote a record, readable without parsing it
_TAG_SIZE = 32
HEAD_SIZE = _HEAD.size  # the fixed part before the head JSON (head_end reads it)
UNSIGNED_KEY_ID = bytes(8)


class Verdict(enum.Enum):
    """What a reader may conclude about a record it cannot use."""

    OK = "ok"
    OLD = "written in the previous record format"
    UNKNOWN = "in a record format this version does not know"
    FOREIGN = "signed with another secret"
    NO_SECRET = "signed, and this store has no secret to verify it"
    UNSIGNED = "unsigned, and this store accepts only signed entries"
    DAMAGED = "damaged (its checksum does not match)"


def key_id(secret: bytes | None) -> bytes:
    """The 8-byte fingerprint of ``secret`` stored in each signed record (zeros: unsigned)."""
    if secret is None:
        return UNSIGNED_KEY_ID
    import hmac  # here, not at import: a store that never reads a signed record never needs it

    return hmac.new(secret, b"kernelcache redis key id", hashlib.sha256).digest()[:8]


def writer_prefix(secret: bytes | None) -> bytes:
    """The first PREFIX_SIZE bytes of every record written with ``secret``."""
    return MAGIC + bytes([_SIGNED if secret is not None else 0]) + key_id(secret)


def _tag(secret: bytes | None, name: str, body: bytes | memoryview) -> bytes:
    import hmac

    h: Any = hashlib.sha256() if secret is None else hmac.new(secret, digestmod=hashlib.sha256)
    h.update(name.encode() + b"\0")
    h.update(body)  # a memoryview of the record: no copy of a large artifact
    return h.digest()


def encode(
    name: str, payload: bytes, meta: dict[str, Any], secret: bytes | None, *, created: float | None = None
) -> bytes:
    """The record for ``payload`` and ``meta`` under ``name``; ``created`` defaults to now
    (a copy keeps its source's, so copying a cache twice gives the same bytes)."""
    stamp = time.time() if created is None else created
    head = json.dumps({"size": len(payload), "created": stamp, "meta": meta}, separators=(",", ":")).encode()
    body = _HEAD.pack(MAGIC, _SIGNED if secret is not None else 0, key_id(secret), len(head)) + head + payload
    return body + _tag(secret, name, body)


def decode(name: str, raw: bytes, secret: bytes | None) -> tuple[Verdict, tuple[bytes, dict[str, Any]] | None]:
    """(OK, (payload, meta)) for a record that passes its check, else (why not, None)."""
    magic = raw[:4]
    if magic != MAGIC:
        return (Verdict.OLD if magic in OLD_MAGICS else Verdict.UNKNOWN), None
    if len(raw) < _HEAD.size + _TAG_SIZE:
        return Verdict.DAMAGED, None
    _, flags, kid, head_len = _HEAD.unpack_from(raw)
    if flags not in (0, _SIGNED):
        return Verdict.UNKNOWN, None
    if flags == _SIGNED:
        if secret is None:
            return Verdict.NO_SECRET, None
        if kid != key_id(secret):
            return Verdict.FOREIGN, None
    elif secret is not None:
        return Verdict.UNSIGNED, None
    import hmac

    view = memoryview(raw)
    if not hmac.compare_digest(raw[-_TAG_SIZE:], _tag(secret, name, view[:-_TAG_SIZE])):
        return Verdict.DAMAGED, None
    try:
        head = json.loads(raw[_HEAD.size : _HEAD.size + head_len])
        payload = raw[_HEAD.size + head_len : -_TAG_SIZE]
        if head["size"] != len(payload):
            raise ValueError("size mismatch")
        meta = head.get("meta")
    except (ValueError, KeyError, TypeError):
        return Verdict.DAMAGED, None  # checked, yet malformed: written broken by our own format
    return Verdict.OK, (payload, meta if isinstance(meta, dict) else {})


def peek_head(raw: bytes) -> dict[str, Any] | None:
    """The head JSON (size, created, meta) of a record's first bytes, NOT verified: for listings.

    None when ``raw`` is not a record of this format or stops before its head ends."""
    if raw[:4] != MAGIC or len(raw) < _HEAD.size:
        return None
    head_len = _HEAD.unpack_from(raw)[3]
    try:
        head = json.loads(raw[_HEAD.size : _HEAD.size + head_len])
    except ValueError:
        return None
    return head if isinstance(head, dict) else None


def head_end(prefix: bytes) -> int:
    """Where the head of the record starting with ``prefix`` (HEAD_SIZE bytes) ends; 0: not a record."""
    if prefix[:4] != MAGIC or len(prefix) < _HEAD.size:
        return 0
    return _HEAD.size + _HEAD.unpack_from(prefix)[3]


def owner_of(prefix: bytes, secret: bytes | None) -> Verdict:
    """Why a record that starts with ``prefix`` (PREFIX_SIZE bytes) cannot be verified by ``secret``."""
    verdict, _ = decode("", prefix.ljust(_HEAD.size + _TAG_SIZE, b"\0"), secret)
    return Verdict.UNKNOWN if verdict in (Verdict.OK, Verdict.DAMAGED) else verdict


def unverifiable_warning(verdict: Verdict, where: str, secret_variable: str) -> tuple[str, str]:
    """(cause, text) of the one warning a shared store gives for a record it may not judge.

    ``where`` names the record (``Redis entry ns:e:...``, ``object ... in s3://...``). Another
    secret is loud: the host is misconfigured for its fleet. Every such record is a miss,
    never replaced or deleted by this host.
    """
    if verdict is Verdict.FOREIGN:
        return "foreign-secret", (
            f"{where} is signed with another secret: THIS HOST'S SECRET DOES NOT MATCH THE FLEET'S. Such records "
            f"are misses here and are never replaced or deleted by this host; give it the team's secret "
            f"(secret= / {secret_variable})"
        )
    cause = f"unverifiable-{verdict.name}"
    return cause, f"{where} is {verdict.value}; a miss, left in place (never replaced or deleted)"
