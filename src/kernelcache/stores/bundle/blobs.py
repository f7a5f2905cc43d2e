"""Named blobs: bytes that are not a compiled entry (torch.compile's Mega-Cache), carried in a
bundle as records of a kind of their own.

A blob is an ordinary record (stores/record.py: checked on every read, signed like any other)
stored under a name that no key can have: ``sha256(BLOB_DOMAIN + name)``. naming.entry_name
hashes every key with another domain, so no look-up by key ever reaches a blob (that would be
a SHA-256 collision). Its metadata says what it is::

    {"kind": "blob", "blob": NAME, "blob_format": 1, "media_type": ..., ...the writer's fields}

What older readers do with one: they never look its name up (it is no key's), ``bundle verify``
checks it as any record, ``import`` copies it as it is and ``bundle create`` carries it on:
skipped, never misread. This version reads ``blob_format`` 1 only: a blob of another format is
refused (one warning: not found), never guessed at. A cache directory holds a blob the same way
(``FileStreamProgramCache.write_named``), which is how ``bundle create`` puts it into a bundle.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from kernelcache.log import WarnOnce
from kernelcache.stores.base import Meta

BLOB_DOMAIN = b"kernelcache/blob-name/v1\0"
BLOB_KIND = "blob"
BLOB_FORMAT = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
_warned = WarnOnce()


def check_blob_name(name: object) -> str:
    """``name`` if it can name a blob (letters, digits, ``. _ / -``, at most 128); else ValueError."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"blob name {name!r}: use letters, digits and . _ / - (at most 128), e.g. 'torch/mega-cache'")
    return name


def blob_entry_name(name: str) -> str:
    """The record name (64 hex digits, as an entry's) under which the blob ``name`` is stored."""
    return hashlib.sha256(BLOB_DOMAIN + check_blob_name(name).encode()).hexdigest()


def blob_meta(name: str, media_type: str, fields: dict[str, Any] | None = None) -> Meta:
    """The metadata of the blob ``name`` holding bytes of ``media_type`` (plus the writer's ``fields``)."""
    meta: Meta = dict(fields or {})
    meta.update(kind=BLOB_KIND, blob=check_blob_name(name), blob_format=BLOB_FORMAT, media_type=media_type)
    return meta


def is_blob(meta: object) -> bool:
    """Whether a record's metadata says it is a blob (of any format)."""
    return isinstance(meta, dict) and meta.get("kind") == BLOB_KIND


def blob_from_record(name: str, record: tuple[bytes, Meta] | None, where: str) -> tuple[bytes, Meta] | None:
    """The (bytes, meta) of the blob ``name`` from the verified ``record`` read under its name.

    None when there is none, and (one warning) when the record there is not this blob in a
    format this version reads: a record that merely sits at the name is never taken for it."""
    if record is None:
        return None
    meta = record[1]
    if not is_blob(meta) or meta.get("blob") != name:
        _warned.warn(
            f"{where}:{name}:kind", f"{where}: the record under blob {name!r}'s name is not that blob; ignored"
        )
        return None
    if meta.get("blob_format") != BLOB_FORMAT:
        _warned.warn(
            f"{where}:{name}:format",
            f"{where}: blob {name!r} is of format {meta.get('blob_format')!r}, which this version of kernelcache "
            f"does not read (it reads {BLOB_FORMAT}); ignored",
        )
        return None
    return record
