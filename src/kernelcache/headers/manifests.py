"""Header manifests: which headers each compile of a source+options read (ccache "direct mode").

A C++ entry's key (its "full key") is the source+options key plus the digest of the headers
the compile read, which are known only after the compile. So compile_program stores, under
a manifest key derived from the source+options key, a manifest: a few *variants* (each a set
of headers with their digests, see variants.py), newest first. A look-up takes the first
variant whose headers still validate and derives the full key from it.

Manifests are memoised per process and per store, full keys per process: any variant that
validates gives a correct key (the key is derived from the header contents), so a stale
memo can only cost a look-up, never serve wrong code.

Through a tiered store each tier holds its own copy of a manifest, and the near ones
(this process's memory, this host's disk) can be older than the shared one (Redis, where
every host adds its variants). So a look-up reads the tiers' copies nearest first until one
has a variant that validates, and an update merges every writable tier's copy, the shared
tier's variants first, before it writes the result to them all: a host never drops the
variants that other hosts added.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from kernelcache import forksafe
from kernelcache.headers import index as header_index
from kernelcache.headers import records, variants
from kernelcache.headers import scan as includes
from kernelcache.headers.digests import file_digest
from kernelcache.headers.watch import Look
from kernelcache.keys.derive import digest_components
from kernelcache.keys.options import OPTION_POLICY, TRACKED, emits_flag
from kernelcache.memo import remember
from kernelcache.stores.base import ProgramCacheResource
from kernelcache.stores.cuda_core import ForeignStore
from kernelcache.stores.safe import read_record, write_record
from kernelcache.stores.tiered import leaf_tiers

_MEMO_LIMIT = 4096
_STORES_PER_KEY = 8  # stores remembered per manifest key (a process uses a few at most)
_manifest_memo_lock = threading.Lock()
# manifest key -> {id(store): manifest}. Keyed by the store: one store's manifest says
# nothing of what another holds. An id reused by a later store can only cost a look-up.
_manifest_memo: dict[bytes, dict[int, dict[str, Any]]] = {}
_full_key_memo: dict[tuple[bytes, str], bytes] = {}


def _fresh_lock_in_child() -> None:
    global _manifest_memo_lock
    _manifest_memo_lock = threading.Lock()


forksafe.reset_function_in_child(_fresh_lock_in_child)


def _store_id(cache: ProgramCacheResource) -> int:
    # A cuda.core store is wrapped anew by every call: its memo is the wrapped store's.
    return id(cache.store) if isinstance(cache, ForeignStore) else id(cache)


def _memo_get(cache: ProgramCacheResource, manifest_key: bytes) -> dict[str, Any] | None:
    with _manifest_memo_lock:
        return _manifest_memo.get(manifest_key, {}).get(_store_id(cache))


def _memo_put(cache: ProgramCacheResource, manifest_key: bytes, manifest: dict[str, Any]) -> None:
    with _manifest_memo_lock:
        per_store = _manifest_memo.get(manifest_key)
        if per_store is None or len(per_store) >= _STORES_PER_KEY:
            per_store = {}
            remember(_manifest_memo, manifest_key, per_store, _MEMO_LIMIT)
        per_store[_store_id(cache)] = manifest


def _tiers(cache: ProgramCacheResource) -> list[ProgramCacheResource]:
    """The stores that hold their own copy of a manifest, nearest first."""
    return leaf_tiers(cache)


def _stored(
    tier: ProgramCacheResource, manifest_key: bytes, cache: ProgramCacheResource | None = None
) -> dict[str, Any] | None:
    """The manifest ``tier`` holds, its variants loaded (from that tier, else from ``cache``:
    one whose record is gone from every tier is left out: it can only cost a compile)."""
    record = read_record(tier, manifest_key)
    listed = parse_manifest(record[0]) if record else None
    if listed is None:
        return None
    loaded = [v for v in (_variant(tier, d, cache) for d in listed["variants"]) if v is not None]
    return {"format": variants.MANIFEST_FORMAT, "variants": loaded}


def variant_key(digest: str) -> bytes:
    """The key a variant's record is stored under (content-addressed: one record per variant,
    shared by every source+options whose compiles read the same headers)."""
    return digest_components([("header-variant", digest.encode()), ("format", b"%d" % variants.MANIFEST_FORMAT)])


_variant_memo: dict[str, dict[str, Any]] = {}  # digest -> variant (content-addressed: any store's)


def _variant(tier: ProgramCacheResource, digest: str, cache: ProgramCacheResource | None) -> dict[str, Any] | None:
    known = _variant_memo.get(digest)
    if known is not None:
        return known
    for store in (tier, cache) if cache is not None and cache is not tier else (tier,):
        record = read_record(store, variant_key(digest))
        variant = variants.variant_from_bytes(record[0], digest) if record else None
        if variant is not None:
            remember(_variant_memo, digest, variant, 1024)
            return variant
    return None


def stored_variant(cache: ProgramCacheResource, digest: str) -> dict[str, Any] | None:
    """The variant whose digest is ``digest`` (this process's memo, else ``cache``'s record)."""
    return _variant(cache, digest, None)


# A preprocessing hint: the digest of the variant the last header pass of one preprocessing
# (compile.tracing.HeaderTrace.preprocessing_key) gave, so that another process compiling
# another instantiation of the same source can skip its pass. Only ever a hint: a variant is
# built from the headers it names and used where its digest is this one.
def _hint_key(preprocessing: bytes) -> bytes:
    return digest_components([("preprocessing", preprocessing), ("format", b"1")])


def preprocessing_hint(cache: ProgramCacheResource, preprocessing: bytes) -> str | None:
    """The variant digest ``cache`` holds for ``preprocessing``; None where it holds none."""
    record = read_record(cache, _hint_key(preprocessing))
    digest = record[0] if record else b""
    return digest.decode("ascii") if len(digest) == 64 and digest.isalnum() else None


def store_preprocessing_hint(cache: ProgramCacheResource, preprocessing: bytes, digest: str) -> None:
    write_record(cache, _hint_key(preprocessing), digest.encode("ascii"), {"kind": "manifest"}, internal=True)


def _held_everywhere(cache: ProgramCacheResource, digest: str) -> bool:
    """Whether every writable tier holds the record of the variant ``digest`` already, as the
    bytes that digest names (then they are this variant's: a record is content-addressed), and
    keeps it for this read as a rewrite would (``reads_renew``).

    The instantiations of one template (CuPy's kernels, one name expression each) share one
    variant: rewriting its record on each of their misses was most of a tracked miss's store
    (JSON of hundreds of headers and their probes). Each tier is read, not this process's memo
    trusted: a record evicted or cleared since would otherwise never be written again. A tier
    whose records live by their last write (Redis with a ttl, a file cache with
    touch_on_read=False) is written as before: the record, shared by every entry of the
    variant, must outlive the newest of them, not expire with the first.
    Race: one evicted between this read and the manifest's write below leaves the manifest
    naming a record that is gone; a look-up then leaves that variant out (a miss, never a
    wrong entry) and that miss's store writes the record again.
    """
    key = variant_key(digest)
    for tier in _tiers(cache):
        if tier.read_only:
            continue
        if not tier.reads_renew:
            return False
        record = read_record(tier, key)
        if record is None or not records.is_record_of(record[0], digest):
            return False
    return True


def _write_variant(store: ProgramCacheResource, variant: dict[str, Any]) -> None:
    write_record(
        store, variant_key(variant["digest"]), variants.variant_bytes(variant), {"kind": "manifest"}, internal=True
    )


def _manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """A manifest as stored: its variants' digests, newest first (each variant a record of its own)."""
    listed = [v["digest"] for v in manifest["variants"]]
    return json.dumps({"format": variants.MANIFEST_FORMAT, "variants": listed}, separators=(",", ":")).encode()


def _first_match(manifest: dict[str, Any] | None, dirs: list[str], look: Look) -> dict[str, Any] | None:
    for variant in (manifest or {}).get("variants", ()):
        if variants.variant_matches(variant, dirs, look):
            return variant
    return None


def tracks_headers(options: Any) -> bool:
    """Whether options set a field that names headers (OPTION_POLICY's TRACKED fields)."""
    return any(emits_flag(f, getattr(options, f, None)) for f, p in OPTION_POLICY.items() if p == TRACKED)


def manifest_key(base: list[tuple[str, bytes]]) -> bytes:
    """The key a source+options' manifest is stored under."""
    return digest_components([*base, ("manifest", b"%d" % variants.MANIFEST_FORMAT)])


def full_key(base: list[tuple[str, bytes]], variant: dict[str, Any], manifest_key: bytes = b"") -> bytes:
    """The entry key: the base components plus the digest of the headers the compile read.

    ``manifest_key``: when given, the result is memoised under it and the variant's digest.
    """
    memo_key = (manifest_key, variant["digest"])
    key = _full_key_memo.get(memo_key) if manifest_key else None
    if key is None:
        key = digest_components([*base, ("headers", variant["digest"].encode())])
        if manifest_key:
            remember(_full_key_memo, memo_key, key, _MEMO_LIMIT)
    return key


def matching_variant(cache: ProgramCacheResource, manifest_key: bytes, dirs: list[str]) -> dict[str, Any] | None:
    """The first variant of this source's manifest whose headers still validate.

    Variants remembered in this process for this store are tried first, then each tier's
    stored copy, nearest first. A variant found only in a farther tier is written to the
    nearer ones (as a hit promotes an artifact), merged with what they hold.
    """
    index = header_index.for_store(cache)
    # Watched from the process's first look-up on (headers.watch.Look): the kernels of one process
    # share their headers (one library's include tree), so a header watched for one kernel is
    # trusted without a stat by every later look-up of any kernel naming it. Measured on 12 CUB
    # kernels (716 headers, 2 variants): a process's first pass stat'ed without watching was a
    # fifth of its all-hit time; a watch costs one call per header, once per process.
    look = Look(index)
    try:
        return _matching_variant(cache, manifest_key, dirs, look)
    finally:
        look.commit()  # what it proved under watch, trusted by this process's next look-ups
        index.save()  # what this look-up learned, for the next process (a write only if it learned)


def _matching_variant(
    cache: ProgramCacheResource, manifest_key: bytes, dirs: list[str], look: Look
) -> dict[str, Any] | None:
    found = _first_match(_memo_get(cache, manifest_key), dirs, look)
    if found is not None:
        return found
    tiers = _tiers(cache)
    merged: dict[str, Any] | None = None
    for i, tier in enumerate(tiers):
        stored = _stored(tier, manifest_key, cache)
        if stored is None:
            continue
        merged = merge_manifests(merged, stored)
        found = _first_match(stored, dirs, look)
        if found is not None:
            if i:
                promoted = add_variant(merged, found)  # bounded, the one that matched first
                raw = _manifest_bytes(promoted)
                for upper in tiers[:i]:
                    if not upper.read_only:
                        _write_variant(upper, found)  # the record before the manifest naming it
                        write_record(upper, manifest_key, raw, {"kind": "manifest"}, internal=True)
            break
    if merged is not None:
        _memo_put(cache, manifest_key, merged)
    return found


def digests_before(manifest_key: bytes, dirs: list[str]) -> dict[str, str]:
    """The digests, read now, of every header this source's known variants name.

    Taken before a compile: a header whose digest after the compile differs was changed
    while NVRTC ran (variants.build_variant then refuses to store the result).
    """
    with _manifest_memo_lock:
        known = list(_manifest_memo.get(manifest_key, {}).values())
    manifest = None
    for each in known:  # every store's: a header any of them names
        manifest = merge_manifests(manifest, each)
    out = {}
    for path in variants.header_paths(manifest, dirs):
        digest = file_digest(path)
        if digest is not None:
            out[path] = digest
    return out


def store_manifest(cache: ProgramCacheResource, manifest_key: bytes, variant: dict[str, Any]) -> None:
    """Add variant to the stored manifest (newest first), in every writable tier.

    The copies of all writable tiers are merged first, the farthest (shared) tier's variants
    first: a near copy older than the shared one must not replace it. Read-only tiers (a
    bundle) are neither merged nor written.
    """
    # Read-modify-write of the manifest: callers hold the single-flight lock of this source,
    # which serialises it against every thread and process sharing the cache directory (and
    # every host, where a tier has a remote lock). A host without the remote lock (Redis
    # down, then back) can still race another host's update; the merge then keeps what each
    # read, and the next update of either brings the other's variant back from its own tiers.
    merged: dict[str, Any] | None = None
    for tier in reversed(_tiers(cache)):
        if not tier.read_only:
            merged = merge_manifests(merged, _stored(tier, manifest_key, cache))
    manifest = add_variant(merged, variant)
    # The variant's record first: a reader that finds the manifest finds what it names (a
    # record gone later, evicted or cleared, leaves that variant out: a compile, never a
    # wrong entry, since a variant is only trusted as the bytes its digest names).
    if not _held_everywhere(cache, variant["digest"]):
        _write_variant(cache, variant)
    write_record(cache, manifest_key, _manifest_bytes(manifest), {"kind": "manifest"}, internal=True)
    remember(_variant_memo, variant["digest"], variant, 1024)
    _memo_put(cache, manifest_key, manifest)


def header_changes(cache: ProgramCacheResource, manifest_key: bytes, dirs: list[str]) -> dict[str, list[str]] | None:
    """What changed since the newest stored compile of this source+options, header by header.

    ``changed``: recorded headers whose content differs now; ``vanished``: recorded headers
    that are gone; ``added``: headers that now shadow a recorded one (the same name, found
    earlier on the search path). None when no manifest is stored (never compiled here).
    """
    if not manifest_key:
        return None  # a source that names no header has no manifest
    stored = _stored(cache, manifest_key)
    if stored is None or not stored["variants"]:
        return None
    changes: dict[str, list[str]] = {"changed": [], "added": [], "vanished": []}
    newest = stored["variants"][0]
    paths = variants.entry_paths(newest, dirs)
    for entry, path in zip(newest.get("headers", ()), paths):
        if path is None:
            continue
        index = entry[0] if not isinstance(entry[0], str) else -1
        for earlier in dirs[:index] if index >= 0 else ():
            if earlier and os.path.isfile(os.path.join(earlier, entry[1])):
                changes["added"].append(os.path.join(earlier, entry[1]))
                break
        now = file_digest(path)
        if now is None:
            changes["vanished"].append(path)
        elif now != entry[-1]:
            changes["changed"].append(path)
    # Probed names (includes, __has_include) that now resolve elsewhere, or no longer at all.
    for where, kind, name, at in variants.probes_of(newest):
        known = paths[where] if 0 <= where < len(paths) else None
        includer = os.path.dirname(known) if known else None
        places = includes.candidates(kind, name, includer, dirs, newest.get("first_include", len(dirs)))
        now_at = includes.resolve(name, places)
        if now_at != at:
            if now_at >= 0:
                changes["added"].append(os.path.join(places[now_at], name))
            elif 0 <= at < len(places):
                changes["vanished"].append(os.path.join(places[at], name))
    return {what: list(dict.fromkeys(found)) for what, found in changes.items()}


def gone_variants(cache: ProgramCacheResource, manifest_key: bytes) -> int:
    """How many variants the stored manifest of this source+options names whose record no tier
    holds (evicted or removed): their entries may be stored still, but no look-up can vouch for
    them (a miss, whose compile writes the record again)."""
    record = read_record(cache, manifest_key) if manifest_key else None
    listed = parse_manifest(record[0]) if record else None
    if listed is None:
        return 0
    return sum(_variant(cache, digest, None) is None for digest in listed["variants"])


def add_variant(manifest: dict[str, Any] | None, variant: dict[str, Any]) -> dict[str, Any]:
    """The manifest with ``variant`` first (deduplicated, at most variants.MAX_VARIANTS)."""
    old = (manifest or {}).get("variants", [])
    kept = [variant] + [v for v in old if v["digest"] != variant["digest"]]  # a digest names its content
    return {"format": variants.MANIFEST_FORMAT, "variants": kept[: variants.MAX_VARIANTS]}


def merge_manifests(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any] | None:
    """first's variants, then second's that first lacks (either may be None)."""
    if first is None or second is None:
        return first if second is None else second
    ours = first.get("variants", [])
    known = {v["digest"] for v in ours}
    theirs = [v for v in second.get("variants", []) if v["digest"] not in known]
    return {"format": variants.MANIFEST_FORMAT, "variants": ours + theirs}


def parse_manifest(raw: bytes | None) -> dict[str, Any] | None:
    """The manifest in ``raw`` (its variants' digests); None when it is not one of this format."""
    if not raw:
        return None
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != variants.MANIFEST_FORMAT:
        return None
    listed = manifest.get("variants")
    if not isinstance(listed, list) or not all(isinstance(d, str) and len(d) == 64 for d in listed):
        return None
    return manifest
