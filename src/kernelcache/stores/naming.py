"""The one rule that names an entry on disk and in Redis, from its key (and the prefix tools print)."""

from __future__ import annotations

import hashlib

# Every key is hashed with this prefix, whatever its length or form. Layout v1 named a
# 32-byte key by its own hex and any other key by its SHA-256, so a key K and the key
# sha256(K) shared one entry. A digest of (domain, key) gives every key one name, and no
# key can be chosen to land on another key's name (that would be a SHA-256 collision).
_DOMAIN = b"kernelcache/entry-name/v2\0"


def entry_name(key: bytes) -> str:
    """The name of key's entry: 64 hex digits, ``sha256(domain + key)``.

    The tools (``ls``, ``show``, ``export``, ``verify``, ``explain``) print a prefix of this
    name and accept it; it is the entry's file name in a FileStreamProgramCache.
    """
    return hashlib.sha256(_DOMAIN + key).hexdigest()


def key_prefix(key: bytes) -> str:
    """The prefix of key's entry name that ``kernelcache ls`` prints and ``show`` accepts."""
    return entry_name(key)[:16] if key else "-"
