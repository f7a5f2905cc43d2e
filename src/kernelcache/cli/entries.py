"""What the listing and maintenance tools do to a FileStreamProgramCache directory."""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import re
import time
from typing import Any

from kernelcache.stores.fileops import open_regular, read_fd
from kernelcache.stores.filestream import DEFAULT_TMP_MAX_AGE_S, EntryInfo, FileStreamProgramCache

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """'30d' -> seconds; ValueError with the accepted forms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if m is None:
        raise ValueError(f"bad age {text!r}: use a number and a unit s/m/h/d/w, e.g. 30d or 12h")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def when(ts: float | None) -> str:
    if ts is None:
        return ""
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def is_manifest(entry: EntryInfo) -> bool:
    meta = (entry.meta or {}).get("meta") or {}
    return meta.get("kind") == "manifest"


def _row(entry: EntryInfo) -> dict[str, Any]:
    record = entry.meta or {}
    meta = record.get("meta") or {}
    return {
        "key": entry.name,
        "code_type": meta.get("code_type", "?"),
        "target_type": meta.get("target_type", "?"),
        "size": entry.size,
        "created": record.get("created"),
        "last_used": entry.atime,
        "compile_seconds": meta.get("compile_seconds"),
        "kernels": meta.get("kernels") or [],
    }


_SORTS = {
    "last-used": (lambda r: r["last_used"] or 0, True),
    "created": (lambda r: r["created"] or 0, True),
    "size": (lambda r: r["size"], True),
    "compile-time": (lambda r: r["compile_seconds"] or 0, True),
}


def list_rows(cache: FileStreamProgramCache, sort: str, limit: int | None) -> list[dict[str, Any]]:
    rows = [_row(e) for e in cache.iter_entries() if not is_manifest(e)]
    key, reverse = _SORTS[sort]
    rows.sort(key=key, reverse=reverse)
    return rows[:limit] if limit else rows


def find_by_prefix(cache: FileStreamProgramCache, prefix: str) -> EntryInfo:
    """The one entry whose key starts with prefix; LookupError if none or several."""
    p = prefix.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,64}", p):
        raise LookupError(f"bad key prefix {prefix!r}: use hex digits, as `kernelcache ls` prints them")
    matches = [e for e in cache.iter_entries() if e.name.startswith(p) and not is_manifest(e)]
    if not matches:
        raise LookupError(f"no entry with key prefix {prefix!r} in {cache.path}")
    if len(matches) > 1:
        names = ", ".join(m.name[:16] for m in matches[:5])
        raise LookupError(f"key prefix {prefix!r} is ambiguous ({len(matches)} entries: {names}...); give more digits")
    return matches[0]


def describe(entry: EntryInfo) -> dict[str, Any]:
    record = entry.meta or {}
    return {
        "key": entry.name,
        "path": entry.path,
        "size": entry.size,
        "sha256": record.get("sha256"),
        "created": when(record.get("created")),
        "last_used": when(entry.atime),
        "meta": record.get("meta") or {},
    }


def read_verified(entry: EntryInfo) -> bytes | None:
    """The entry's bytes if they match its sidecar (which passed its own check), else None."""
    try:
        fd, st = open_regular(entry.path)  # never a FIFO or a symlink: a tool must not hang
    except OSError:
        return None
    try:
        data = read_fd(fd, st.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)
    record = entry.meta or {}
    if record.get("size") != len(data) or record.get("sha256") != hashlib.sha256(data).hexdigest():
        return None
    return data


def verify(cache: FileStreamProgramCache, *, fix: bool, progress: bool) -> dict[str, Any]:
    """Re-hash every entry; find corrupt entries, orphaned sidecars, stale temp files."""
    entries = list(cache.iter_entries())
    corrupt: list[str] = []
    iterator: Any = entries
    if progress and entries:
        from rich.progress import track

        iterator = track(entries, description="verifying", transient=True)
    for e in iterator:
        if read_verified(e) is None:
            corrupt.append(e.name)
    present = {e.name for e in entries}
    orphans = []
    for f, _ in cache.scan():
        if f.name.endswith(".meta") and f.name[: -len(".meta")] not in present:
            orphans.append(f.path)
    stale = []
    cutoff = time.time() - DEFAULT_TMP_MAX_AGE_S
    try:
        with os.scandir(cache.tmp_dir) as it:
            stale = [f.path for f in it if f.stat(follow_symlinks=False).st_mtime < cutoff]
    except OSError:
        pass
    fixed = 0
    if fix:
        for name in corrupt:
            cache.remove_entry(name)
            fixed += 1
        for path in orphans + stale:
            try:
                os.unlink(path)
                fixed += 1
            except OSError:
                pass
    total = len(corrupt) + len(orphans) + len(stale)
    return {
        "checked": len(entries),
        "corrupt": corrupt,
        "orphaned_sidecars": orphans,
        "stale_temps": stale,
        "fixed": fixed,
        "remaining": total - fixed,
    }


def prune(cache: FileStreamProgramCache, max_size: int | None, max_age: float | None, now: float) -> dict[str, int]:
    # Artifacts only: header manifests are tiny, and removing one only costs its source a
    # recompile; they go with clear, or with verify --fix when unreadable.
    entries = sorted((e for e in cache.iter_entries() if not is_manifest(e)), key=lambda e: e.atime)  # LRU first
    removed = freed = 0
    kept = []
    for e in entries:
        if max_age is not None and now - e.atime > max_age:
            freed += cache.remove_entry(e.name, evicted=True)
            removed += 1
        else:
            kept.append(e)
    if max_size is not None:
        total = sum(e.size + _sidecar_size(e) for e in kept)
        for e in kept:
            if total <= max_size:
                break
            got = cache.remove_entry(e.name, evicted=True)
            total -= got
            freed += got
            removed += 1
    return {"removed": removed, "freed_bytes": freed}


def _sidecar_size(entry: EntryInfo) -> int:
    try:
        return os.path.getsize(entry.path + ".meta")
    except OSError:
        return 0
