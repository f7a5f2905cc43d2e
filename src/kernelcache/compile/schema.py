"""The schema of an artifact's stored metadata: versioned inside the record, checked on read.

Every store (file, memory, Redis, bundles, object store, a cuda.core store) keeps the
metadata beside the artifact under the record's own check, so a record that passes that
check is intact; it may still come from another kernelcache version sharing the directory
or namespace, whose metadata has another shape. ``schema`` in the metadata says which
shape it is. A hit uses a record only when its schema is META_SCHEMA and every field a hit
or a listing reads has the type this version reads it as; anything else is a miss, which
compiles and stores this version's record. It is never an error, never a warning and never
a removal: the record is not damaged, it is not this version's to judge.

Schema 1 is the metadata before it carried a version (no ``schema`` field): a miss.
Change META_SCHEMA only with the shape of what artifact_meta stores.
"""

from __future__ import annotations

from typing import Any

from kernelcache.memo import remember

META_SCHEMA = 2
SCHEMA_FIELD = "schema"

# Field -> the types a hit or a listing reads it as (bool is an int: refused where a number
# is meant, below).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "code_type": (str,),
    "target_type": (str,),
    "name": (str,),
    "symbols": (list,),
    "log": (str,),
    "compile_seconds": (int, float),
    "toolchain": (dict,),
    "options": (dict,),
    "headers": (list,),
    "kernels": (list,),
}


# id(meta) -> meta, for metadata objects already found usable. A store hands out one dict per
# verified record again and again (the file store's verified-pair memo), and metadata read
# from a store is never changed afterwards, so a hit checks each such object once. The memo
# holds the object itself: its id cannot be reused by another object while it is here.
# No lock: each dict operation is atomic, and an entry lost to a concurrent clear costs one check.
_usable: dict[int, Any] = {}
_USABLE_LIMIT = 1024


def meta_is_usable(meta: Any) -> bool:
    """Whether an artifact record's metadata is of this schema and shape (else: a miss)."""
    if _usable.get(id(meta)) is meta:
        return True
    if _check(meta):
        remember(_usable, id(meta), meta, _USABLE_LIMIT)
        return True
    return False


def _check(meta: Any) -> bool:
    if not isinstance(meta, dict) or type(meta.get(SCHEMA_FIELD)) is not int or meta[SCHEMA_FIELD] != META_SCHEMA:
        return False
    for field, types in _FIELD_TYPES.items():
        value = meta.get(field)
        if not isinstance(value, types) or isinstance(value, bool):
            return False
    if not all(isinstance(h, str) for h in meta["headers"]) or not all(isinstance(k, str) for k in meta["kernels"]):
        return False
    return all(_is_symbol(item) for item in meta["symbols"])


def _is_symbol(item: Any) -> bool:
    """One encoded symbol: [kind, name expression, kind, mangled name], kinds "s" or "b"."""
    return (
        isinstance(item, list)
        and len(item) == 4
        and all(isinstance(part, str) for part in item)
        and item[0] in ("s", "b")
        and item[2] in ("s", "b")
        and all(_latin1(text) for kind, text in (item[:2], item[2:]) if kind == "b")
    )


def _latin1(text: str) -> bool:
    """Whether bytes stored as text (kind "b") decode back to bytes."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True
