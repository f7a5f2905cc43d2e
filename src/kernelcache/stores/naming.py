"""The one rule that names an entry on disk and in Redis, from its key."""

from __future__ import annotations

import hashlib


def entry_name(key: bytes) -> str:
    """The name of key's entry: 64 hex digits.

    A 32-byte key (what make_program_cache_key returns) is named by its own hex, so the key
    prefix that tools print is the file name; any other key is named by its SHA-256, a fixed
    length whatever the key's (file names stop at 255 bytes).
    """
    return key.hex() if len(key) == 32 else hashlib.sha256(key).hexdigest()
