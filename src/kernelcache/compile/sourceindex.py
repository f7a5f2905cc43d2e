"""The source index: which keys a store holds for one source, so a miss can say what differs.

A miss is explained against the entries stored for the same source (the same code,
code_type and target_type) under other keys: the nearest one (fewest differing components)
and the components that differ, shown as the key sees them (keys.explain: the one rule for
"what differs", which ``kernelcache explain`` uses too: ``options.<field>`` with both values,
``toolchain.*``, ``name_expressions``, ``extra_digest``), and for an entry of the same source
and options the headers that changed, appeared or vanished, with paths.

The index is an ordinary record (internal, like a header manifest) under a key derived from
the source alone, so every store kind (disk, Redis, bundles, object store) carries it as it
carries any record. It is read and written on a miss only: a hit never reads it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kernelcache.headers import digests as hdr
from kernelcache.headers import manifests
from kernelcache.keys.derive import digest_components
from kernelcache.keys.explain import explain_components
from kernelcache.stores.naming import entry_name
from kernelcache.stores.safe import read_record, write_record
from kernelcache.stores.tiered import leaf_tiers

if TYPE_CHECKING:
    from kernelcache.compile.lookup import Lookup

INDEX_FORMAT = 2  # 2: components as keys.explain shows them (1: the options as metadata shows them)
MAX_KEYS = 64  # keys remembered per source (newest first): enough for every arch x option set in use
NO_ENTRY = "no entry for this source"
# What every entry of one source's index shares (the index is per source): never a difference.
_SAME_FOR_THE_SOURCE = frozenset({"schema", "code_type", "target_type", "code"})


def index_key(look: Lookup) -> bytes:
    """The key a source's index is stored under: the source's code, code_type and target_type only.

    Its first component name ("source-index") is one no entry or manifest key starts with.
    """
    parts = dict(look.base)
    return digest_components(
        [
            ("source-index", b"%d" % INDEX_FORMAT),
            ("code_type", parts["code_type"]),
            ("target_type", parts["target_type"]),
            ("code", parts["code"]),
        ]
    )


def components(look: Lookup) -> dict[str, str]:
    """This request's key components as the key sees them (keys.explain), headers aside: two
    requests differ in one of them exactly when their keys differ."""
    shown = explain_components(look.base)
    return {k: v for k, v in shown.items() if k not in _SAME_FOR_THE_SOURCE}


def _parse(record: tuple[bytes, Any] | None) -> list[dict[str, Any]]:
    """The index's entries; [] for no index or one of a format this version does not know."""
    if record is None:
        return []
    try:
        doc = json.loads(record[0])
        entries = doc["entries"] if doc.get("format") == INDEX_FORMAT else []
    except (ValueError, TypeError, KeyError, AttributeError):
        return []
    # Checked to the last field explain() uses: an index that passes its record's check may
    # still come from another writer (another version, an unsigned shared store), and a miss
    # must never raise because of what it holds.
    ok = isinstance(entries, list) and all(
        isinstance(e, dict) and _is_key(e.get("key")) and isinstance(e.get("components"), dict) for e in entries
    )
    return entries if ok else []


def _is_key(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def _merged(look: Lookup, writable_only: bool = False) -> list[dict[str, Any]]:
    """The index's entries as every tier holds them, nearest tier first, each key once.

    Each tier keeps its own copy (a near one may be older than the shared one, a bundle
    holds the index of the cache it was built from): a miss reads them all.
    """
    ikey, seen, out = index_key(look), set(), []
    for tier in leaf_tiers(look.cache):
        if writable_only and tier.read_only:
            continue
        for entry in _parse(read_record(tier, ikey)):
            if entry["key"] not in seen:
                seen.add(entry["key"])
                out.append(entry)
    return out


def nearest(look: Lookup) -> tuple[str, dict[str, tuple[Any, Any]]] | None:
    """The stored entry of this source that differs least (its name), and each differing
    component as (cached, this request's); None when the source has no entry indexed."""
    ours = components(look)
    best: tuple[str, dict[str, tuple[Any, Any]]] | None = None
    for entry in _merged(look):
        theirs = entry["components"]
        diffs = {
            k: (theirs.get(k), ours.get(k)) for k in sorted(ours.keys() | theirs.keys()) if theirs.get(k) != ours.get(k)
        }
        if best is None or len(diffs) < len(best[1]):
            best = (entry_name(bytes.fromhex(entry["key"])), diffs)
    return best


def explain(look: Lookup) -> str:
    """Why this request missed: the nearest stored entry of its source and what differs, or NO_ENTRY."""
    found = nearest(look)
    if found is None:
        return NO_ENTRY
    name, diffs = found
    if diffs:
        shown = "; ".join(f"{k}: cached {_value(a)}, this call {_value(b)}" for k, (a, b) in diffs.items())
        return f"nearest entry {name[:16]} (same source) differs in {shown}"
    return f"nearest entry {name[:16]} has the same source and options; {_header_text(look)}"


def _value(value: Any) -> str:
    return "unset" if value is None else str(value)


def _header_text(look: Lookup) -> str:
    changes = manifests.header_changes(look.cache, look.manifest_key, hdr.search_dirs(look.request.options))
    parts = [f"{what} header {path}" for what, paths in (changes or {}).items() for path in paths]
    if parts:
        return "differs in headers: " + "; ".join(parts)
    if manifests.gone_variants(look.cache, look.manifest_key):
        return (
            "the record of the headers it was compiled with is gone from the store (evicted or removed), "
            "so the entry cannot be vouched for; this compile writes the record again"
        )
    return "its headers are unchanged: the entry is no longer in the store (evicted, removed or failed its check)"


def add(look: Lookup, key: bytes) -> None:
    """Put ``key`` (just stored) first in its source's index.

    Race: two processes storing entries of one source under different options both read,
    merge and write the index; the caller holds the index's own single flight (its thread,
    file and remote locks), so neither loses the other's key. A writer that waited past
    that flight's short budget writes without it, and the last writer wins: a key lost
    from the index makes a later miss's explanation less precise, never a hit wrong (the
    index is never read on a hit).
    """
    entries = [e for e in _merged(look, writable_only=True) if e["key"] != key.hex()]
    entries.insert(0, {"key": key.hex(), "components": components(look)})
    _write(look, entries)


def _write(look: Lookup, entries: list[dict[str, Any]]) -> None:
    raw = json.dumps({"format": INDEX_FORMAT, "entries": entries[:MAX_KEYS]}, separators=(",", ":")).encode()
    write_record(look.cache, index_key(look), raw, {"kind": "source-index"}, internal=True)
