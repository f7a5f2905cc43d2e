"""``kernelcache explain``: why did this miss? Key components compared, and the key the store uses.

What differs is said by one rule, the key's own (keys.explain): a difference named here is a
difference in the key. Three forms:
- two descriptions (manifests or lockfile lines): which components of their keys differ;
- one description and the cache: is it there, under which entry name (the name ``ls``
  prints: for C++ the key includes the headers the compile read), and if not, the nearest
  stored entry of the same source (its source index) and what differs, headers included;
- a key prefix, as ``ls``, the demo and a miss's reason print it: is that entry there, what
  it holds, and where this machine's toolchain differs from the one that built it.
A description is looked up as warm would compile it: in its recorded working directory.
"""

from __future__ import annotations

import os
import re
from typing import Any

from kernelcache.cli.manifest import WarmItem, load_manifest, request_of
from kernelcache.cli.warm import working_directory
from kernelcache.compile.schema import meta_is_usable


def _pick(items: list[WarmItem], entry_name: str | None, path: str) -> WarmItem:
    if entry_name is None:
        return items[0]
    for item in items:
        if item.name == entry_name:
            return item
    raise ValueError(f"manifest {path} has no kernel named {entry_name!r}")


def is_key_prefix(text: str) -> bool:
    """Whether ``explain``'s argument is an entry's name prefix rather than a manifest's path."""
    return not os.path.exists(text) and re.fullmatch(r"[0-9a-fA-F]{4,64}", text) is not None


def explain(first: str, second: str | None, entry_name: str | None, cache_dir: str | None) -> dict[str, Any]:
    """Which key components differ between two descriptions, or between one and the cache,
    or what the entry of a key prefix is.

    ``in_cache``: None for two descriptions, else whether the cache holds the request.
    ``key`` (one description): the entry name the store uses (what ``ls`` prints), or None
    when the entry is absent and its key depends on headers only a compile reveals.
    ``source_key``: the source+options key the components describe (not a store key for C++).
    """
    if second is None and is_key_prefix(first):
        return _by_prefix(first.lower(), cache_dir)
    a_item = _pick(load_manifest(first), entry_name, first)
    if second is not None:
        a = _components(a_item)
        b = _components(_pick(load_manifest(second), entry_name, second))
        diffs = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k) and k != "key"}
        return {"source_key": a["key"], "other_source_key": b["key"], "in_cache": None, "differences": diffs}
    return _against_cache(a_item, cache_dir)


def _components(item: WarmItem) -> dict[str, str]:
    """The item's source+options key components, as the key sees them (headers aside)."""
    from kernelcache.compile.lookup import Lookup
    from kernelcache.keys.derive import digest_components
    from kernelcache.keys.explain import explain_components
    from kernelcache.stores.memory import InMemoryProgramCache

    with working_directory(item.cwd):
        look = Lookup(InMemoryProgramCache(), request_of(item))  # its key material; nothing is read
    return {**explain_components(look.base), "key": digest_components(look.base).hex()}


def _cache_at(cache_dir: str | None) -> tuple[str, Any]:
    """The cache's root and the cache (None where there is none: a diagnostic creates nothing)."""
    from kernelcache import config
    from kernelcache.stores.file.marker import tree_exists
    from kernelcache.stores.file.store import FileStreamProgramCache

    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    # touch_on_read=False: a diagnostic must not change which entries eviction takes first.
    return root, FileStreamProgramCache(root, touch_on_read=False) if tree_exists(root) else None


def _against_cache(item: WarmItem, cache_dir: str | None) -> dict[str, Any]:
    """``explain`` with one description: is it in the cache, and if not, what differs."""
    from kernelcache.compile import sourceindex
    from kernelcache.compile.lookup import Lookup
    from kernelcache.headers import digests as hdr
    from kernelcache.headers import manifests
    from kernelcache.keys.derive import digest_components
    from kernelcache.stores.naming import entry_name as name_of

    root, cache = _cache_at(cache_dir)
    if cache is None:
        source_key = _components(item)["key"]
        return {"key": None, "source_key": source_key, "in_cache": False, "differences": {}, "no_cache_at": root}
    with working_directory(item.cwd) as note:
        look = Lookup(cache, request_of(item))
        key, record, _ = look.find()
        result: dict[str, Any] = {
            "key": name_of(key) if key else None,
            "source_key": digest_components(look.base).hex(),
            "in_cache": record is not None,
            "differences": {},
        }
        if note:
            result["note"] = note
        if record is not None:
            return result
        dirs = hdr.search_dirs(look.request.options)
        headers = manifests.header_changes(cache, look.manifest_key, dirs) if look.track else None
        best = sourceindex.nearest(look)
    if headers is not None:
        result["headers"] = headers
    if best is not None:
        name, diffs = best
        result["closest"] = name[:16]
        if not diffs and not any((headers or {}).values()):
            diffs = {"code or headers": ("cached", "changed")}
        result["differences"] = diffs
    return result


_SHOWN = ("kind", "kernels", "code_type", "target_type", "options", "toolchain", "headers")  # of an entry's metadata


def _by_prefix(prefix: str, cache_dir: str | None) -> dict[str, Any]:
    """``explain <key prefix>``: the entry whose name starts with it, or that none does."""
    from kernelcache.cli.entries import find_by_prefix

    root, cache = _cache_at(cache_dir)
    absent = {"key": None, "prefix": prefix, "in_cache": False, "differences": {}}
    if cache is None:
        return {**absent, "no_cache_at": root}
    try:
        entry = find_by_prefix(cache, prefix)
    except LookupError as exc:
        if "ambiguous" in str(exc):
            raise ValueError(str(exc)) from None
        return absent
    meta = (entry.meta or {}).get("meta") or {}
    summary = {k: meta[k] for k in _SHOWN if k in meta}
    result = {"key": entry.name, "prefix": prefix, "in_cache": True, "entry": summary, "differences": {}}
    if meta.get("kind") in (None, "artifact") and not meta_is_usable(meta):
        result.update(in_cache=False, unusable="a record of another version's schema: this version does not use it")
    result["differences"] = _toolchain_here(meta)
    return result


def _toolchain_here(meta: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Where this machine's toolchain differs from the one that built the entry: a compile
    here has another key, so it does not hit this entry."""
    from kernelcache.keys.toolchain import toolchain_for

    built = meta.get("toolchain")
    if not isinstance(built, dict) or meta.get("code_type") not in ("c++", "ptx", "nvvm"):
        return {}
    here = toolchain_for(meta["code_type"]).as_dict()
    return {f"toolchain.{k}": (built.get(k), here.get(k)) for k in sorted(here) if built.get(k) != here.get(k)}
