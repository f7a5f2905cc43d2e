"""Which headers a compile read, and their digest (a manifest per source, ccache "direct mode" style).

NVRTC 13 has no -M/-E, but ``-fdevice-time-trace=<file>`` writes a JSON trace whose
"Processing Header File" events name every header it processed, nested and empty ones
included. On a miss, compile_program turns that list into a *variant*:

- each header as (search dir index, path relative to it, content SHA-256). The search dirs
  are, in NVRTC's order for a quoted include: the directory of ``options.name``, the
  current directory, then ``include_path``; a header under none of them is kept absolute;
- validation re-resolves each header against the *current* search dirs, checks its content,
  and checks that no earlier search dir now holds a file of the same relative name (a new
  header created earlier on the search path would shadow the one that was used).

A manifest (stored under a key derived from the source+options key) holds a few variants,
newest first; the headers digest of the first variant that validates completes the key.
Headers of the toolchain itself (NVRTC's builtin and bundled headers) are not tracked:
their content is pinned by the NVRTC identity in the key.

Hashing a header is memoised per process by (inode, size, mtime, ctime), so a warm process
pays one stat per tracked header per look-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

from kernelcache.memo import remember

MANIFEST_FORMAT = 1
MAX_VARIANTS = 8  # header versions remembered per source (switching back is still a hit)

_memo_lock = threading.Lock()
_digest_memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}
_MEMO_LIMIT = 65536


def file_digest(path: str) -> str | None:
    """SHA-256 hex of the file's content, or None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _memo_lock:
        known = _digest_memo.get(path)
    if known is not None and known[0] == ident:
        return known[1]
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    with _memo_lock:
        remember(_digest_memo, path, (ident, digest), _MEMO_LIMIT)
    return digest


def as_list(value: Any) -> list[str]:
    """None -> [], a str -> [it], any other iterable -> its items as str."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def search_dirs(options: Any, cwd: str | None = None) -> list[str]:
    """Absolute search directories for quoted includes, in NVRTC's order (memoised)."""
    cwd = cwd or os.getcwd()
    name = getattr(options, "name", None) or ""
    include = getattr(options, "include_path", None)
    memo_key = (cwd, name, include if isinstance(include, (str, type(None))) else tuple(include))
    dirs = _dirs_memo.get(memo_key)
    if dirs is None:
        dirs = []
        name_dir = os.path.dirname(name)
        if name_dir:
            dirs.append(os.path.join(cwd, name_dir))
        dirs.append(cwd)
        dirs += [os.path.join(cwd, d) for d in as_list(include)]
        dirs = [os.path.normpath(d) for d in dirs]
        remember(_dirs_memo, memo_key, dirs, 1024)
    return dirs


_dirs_memo: dict[tuple[Any, ...], list[str]] = {}


def toolchain_header_roots(options: Any) -> list[str]:
    """Directories whose headers belong to the toolchain (not tracked)."""
    roots = []
    try:
        flags = options.as_bytes("nvrtc")
    except Exception:
        flags = []
    for flag in flags:
        text = flag.decode(errors="replace") if isinstance(flag, bytes) else str(flag)
        if text.startswith("--use-bundled-headers="):
            roots.append(os.path.normpath(text.split("=", 1)[1]))
    return roots


def headers_from_trace(trace_path: str, cwd: str) -> list[str] | None:
    """Absolute paths of the headers the trace lists; None if there is no usable trace."""
    # NVRTC appends ".json" to the name it is given; accept both spellings.
    for candidate in (trace_path + ".json", trace_path):
        try:
            with open(candidate, "rb") as f:
                trace = json.load(f)
            break
        except (OSError, ValueError):
            continue
    else:
        return None
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    seen: dict[str, None] = {}
    for event in events:
        if isinstance(event, dict) and event.get("name") == "Processing Header File":
            detail = (event.get("args") or {}).get("detail")
            if isinstance(detail, str) and detail:
                seen[os.path.normpath(os.path.join(cwd, detail))] = None
    return list(seen)


def make_variant(headers: Sequence[str], dirs: Sequence[str], skip_roots: Sequence[str]) -> dict[str, Any]:
    """The manifest variant for the headers one compile read."""
    entries = []
    for path in sorted(headers):
        if any(path == r or path.startswith(r + os.sep) for r in skip_roots):
            continue
        digest = file_digest(path)
        if digest is None:
            if os.path.basename(path).startswith("__nv"):
                continue  # NVRTC's builtin headers exist only inside the library
            digest = "unreadable"  # cannot be validated later: the variant never matches
        index, rel = _locate(path, dirs)
        entries.append([index, rel, digest])
    variant: dict[str, Any] = {"headers": entries}
    variant["digest"] = variant_digest(variant)
    return variant


def _locate(path: str, dirs: Sequence[str]) -> tuple[int, str]:
    """(search dir index, relative path) of the deepest search dir holding ``path``.

    The deepest, not the first: with cwd=/p and include_path=[/p/inc], /p/inc/a.h was found
    as "a.h" through /p/inc, and a new /p/a.h (in cwd, earlier) would shadow it. Recording
    it as "inc/a.h" under cwd would miss that. Erring this way can only cost a miss.
    """
    best = None
    for i, d in enumerate(dirs):
        if path.startswith(d.rstrip(os.sep) + os.sep) and (best is None or len(d) > len(dirs[best])):
            best = i
    if best is None:
        return -1, path  # outside every search dir: kept absolute
    return best, os.path.relpath(path, dirs[best])


def variant_matches(variant: dict[str, Any], dirs: Sequence[str]) -> bool:
    """True when every header still has its recorded content and none is shadowed."""
    for index, rel, digest in variant.get("headers", ()):
        if index < 0:
            path = rel
        elif index < len(dirs):
            path = f"{dirs[index]}{os.sep}{rel}"
            # Shadowing: an earlier search dir that now holds the same relative name wins.
            for earlier in dirs[:index]:
                if os.path.exists(f"{earlier}{os.sep}{rel}"):
                    return False
        else:
            return False  # fewer search dirs than when it was compiled
        if file_digest(path) != digest:
            return False
    return True


def variant_digest(variant: dict[str, Any]) -> str:
    """The key component for a variant's headers (their order, places and contents), hex."""
    encoded = json.dumps(variant.get("headers", []), separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


def tracked_paths(variant: dict[str, Any], dirs: Sequence[str]) -> list[str]:
    out = []
    for index, rel, _ in variant.get("headers", ()):
        out.append(rel if index < 0 or index >= len(dirs) else os.path.join(dirs[index], rel))
    return out


def add_variant(manifest: dict[str, Any] | None, variant: dict[str, Any]) -> dict[str, Any]:
    """The manifest with ``variant`` first (deduplicated, at most MAX_VARIANTS)."""
    old = (manifest or {}).get("variants", [])
    variants = [variant] + [v for v in old if v != variant]
    return {"format": MANIFEST_FORMAT, "variants": variants[:MAX_VARIANTS]}


def parse_manifest(raw: bytes | None) -> dict[str, Any] | None:
    if not raw:
        return None
    try:
        manifest = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return None
    variants = manifest.get("variants")
    if not isinstance(variants, list) or not all(isinstance(v, dict) for v in variants):
        return None
    for variant in variants:
        # Recomputed, never trusted from disk: the digest decides which entry a hit reads.
        variant["digest"] = variant_digest(variant)
    return manifest
