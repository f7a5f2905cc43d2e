"""``kernelcache explain``: why did this miss? Key components compared, and the key the store uses.

Two descriptions: which components of their keys differ. One description and the cache: is
it there, under which entry name (the name ``ls`` prints: for C++ the key includes the
headers the compile read), and if not, which cached entry of the same kernel differs least.
"""

from __future__ import annotations

import os
from typing import Any

from kernelcache.cli.warm import WarmItem, load_manifest, program_options
from kernelcache.compile.schema import meta_is_usable


def _pick(items: list[WarmItem], entry_name: str | None, path: str) -> WarmItem:
    if entry_name is None:
        return items[0]
    for item in items:
        if item.name == entry_name:
            return item
    raise ValueError(f"manifest {path} has no kernel named {entry_name!r}")


def _components(item: WarmItem) -> dict[str, str]:
    """The source+options key's components (before headers: compile_program adds those)."""
    from kernelcache.headers.manifests import tracks_headers
    from kernelcache.keys.derive import explain_program_cache_key

    options = program_options(item)
    # include_path/pre_include: the key derivation needs extra_digest or header tracking;
    # explain shows the source+options part, and a changed header shows as a miss below.
    tracked = tracks_headers(options)
    return explain_program_cache_key(
        code=item.code,
        code_type=item.code_type,
        options=options,
        target_type=item.target_type,
        name_expressions=item.name_expressions,
        extra_digest=b"headers tracked by compile_program" if tracked else None,
    )


def explain(first: str, second: str | None, entry_name: str | None, cache_dir: str | None) -> dict[str, Any]:
    """Which key components differ between two descriptions, or between one and the cache.

    ``key`` (one description): the entry name the store uses (what ``ls`` prints), or None
    when the entry is absent and its key depends on headers only a compile reveals.
    ``source_key``: the source+options key the components describe (not a store key for C++).
    """
    a_item = _pick(load_manifest(first), entry_name, first)
    a = _components(a_item)
    if second is not None:
        b = _components(_pick(load_manifest(second), entry_name, second))
        diffs = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k) and k != "key"}
        return {"source_key": a["key"], "other_source_key": b["key"], "in_cache": None, "differences": diffs}
    return _against_cache(a_item, a, cache_dir)


def _against_cache(item: WarmItem, ours: dict[str, str], cache_dir: str | None) -> dict[str, Any]:
    """``explain`` with one description: is it in the cache, and if not, what differs."""
    from kernelcache import config
    from kernelcache.compile.flow import probe
    from kernelcache.stores.file.marker import tree_exists
    from kernelcache.stores.file.store import FileStreamProgramCache
    from kernelcache.stores.naming import entry_name as name_of

    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    if not tree_exists(root):  # nothing cached there; a diagnostic creates no directory
        return {"key": None, "source_key": ours["key"], "in_cache": False, "differences": {}, "no_cache_at": root}
    # touch_on_read=False: a diagnostic must not change which entries eviction takes first.
    cache = FileStreamProgramCache(root, touch_on_read=False)
    found = probe(
        item.code,
        item.code_type,
        item.target_type,
        options=program_options(item),
        cache=cache,
        name_expressions=item.name_expressions,
    )
    result: dict[str, Any] = {
        "key": name_of(found.key) if found.key else None,
        "source_key": ours["key"],
        "in_cache": found.hit,
        "differences": {},
    }
    if found.hit:
        return result
    headers = _header_changes(item, cache)
    if headers is not None:
        result["headers"] = headers
    best = _closest(item, ours, cache)
    if best is not None:
        name, diffs = best
        result["closest"] = name[:16]
        if not diffs and not any((headers or {}).values()):
            diffs = {"code or headers": ("cached", "changed")}
        result["differences"] = diffs
    return result


def _closest(item: WarmItem, parts: dict[str, str], cache: Any) -> tuple[str, dict[str, Any]] | None:
    """The cached entry of the same kernel(s) that differs least from ``item``, and how."""
    from kernelcache.compile.metadata import options_summary

    ours = {f"options.{k}": v for k, v in options_summary(program_options(item)).items()}
    ours.update({k: v for k, v in parts.items() if k.startswith("toolchain.") or k in ("code_type", "target_type")})
    best = None
    for entry in cache.iter_entries():
        meta = (entry.meta or {}).get("meta") or {}
        if not meta_is_usable(meta) or not set(meta["kernels"]) & {item.name, *item.name_expressions}:
            continue  # another version's record (or a manifest): not comparable
        theirs = {f"options.{k}": v for k, v in (meta.get("options") or {}).items()}
        theirs.update({f"toolchain.{k}": v for k, v in (meta.get("toolchain") or {}).items()})
        theirs.update({"code_type": meta.get("code_type"), "target_type": meta.get("target_type")})
        diffs = {
            k: (theirs.get(k), ours.get(k)) for k in sorted(ours.keys() | theirs.keys()) if ours.get(k) != theirs.get(k)
        }
        if best is None or len(diffs) < len(best[1]):
            best = (entry.name, diffs)
    return best


def _header_changes(item: WarmItem, cache: Any) -> dict[str, list[str]] | None:
    """Each header that changed, appeared or vanished since the stored compile of this source."""
    from kernelcache.compile.lookup import Lookup
    from kernelcache.compile.request import CompileRequest
    from kernelcache.headers import digests as hdr
    from kernelcache.headers import manifests

    options = program_options(item)
    request = CompileRequest.of(item.code, item.code_type, item.target_type, options, item.name_expressions)
    look = Lookup(cache, request)
    if not look.track:
        return None
    return manifests.header_changes(cache, look.manifest_key, hdr.search_dirs(options))
