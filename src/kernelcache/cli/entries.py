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


def _text(value: Any, default: str = "?") -> str:
    return default if value is None or value == "" else str(value)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _row(entry: EntryInfo) -> dict[str, Any]:
    # Metadata is whatever the sidecar's JSON holds (another version, a hand edit): every
    # field is coerced to what the listing expects, never trusted to have its type.
    record = entry.meta if isinstance(entry.meta, dict) else {}
    meta = record.get("meta") if isinstance(record.get("meta"), dict) else {}
    options = meta.get("options") if isinstance(meta.get("options"), dict) else {}
    kernels = meta.get("kernels")
    return {
        "key": entry.name,
        "code_type": _text(meta.get("code_type")),
        "target_type": _text(meta.get("target_type")),
        "arch": _text(options.get("arch"), "").strip("'") or "?",  # older sidecars hold repr strings
        "size": entry.size,
        "created": _number(record.get("created")),
        "last_used": entry.atime,
        "compile_seconds": _number(meta.get("compile_seconds")),
        "kernels": [str(k) for k in kernels] if isinstance(kernels, list) else [str(kernels)] if kernels else [],
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


def progress_lines(items: list[Any], what: str, every_s: float = 2.0) -> Any:
    """Yield items; on a terminal with a progress bar, elsewhere (CI logs) with a line on
    stderr every ``every_s`` seconds and at the end: ``verify [120/4000]``."""
    import sys

    if sys.stderr.isatty():
        from rich.progress import track

        yield from track(items, description=what, transient=True)
        return
    last = time.monotonic()
    for i, item in enumerate(items, 1):
        yield item
        if i == len(items) or time.monotonic() - last >= every_s:
            print(f"{what} [{i}/{len(items)}]", file=sys.stderr, flush=True)
            last = time.monotonic()


def verify(cache: FileStreamProgramCache, *, fix: bool, progress: bool) -> dict[str, Any]:
    """Re-hash every entry; find corrupt entries, orphaned sidecars, stale temp files.

    ``checked`` counts entries as ``ls`` lists them (artifacts); header manifests are
    checked too and counted apart (``manifests_checked``).
    """
    entries = list(cache.iter_entries())
    corrupt: list[str] = []
    iterator: Any = progress_lines(entries, "verify") if progress and entries else entries
    for e in iterator:
        if read_verified(e) is None:
            corrupt.append(e.name)
    manifests = sum(1 for e in entries if is_manifest(e))
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
        "checked": len(entries) - manifests,
        "manifests_checked": manifests,
        "corrupt": corrupt,
        "orphaned_sidecars": orphans,
        "stale_temps": stale,
        "fixed": fixed,
        "remaining": total - fixed,
    }


def prune(
    cache: FileStreamProgramCache, max_size: int | None, max_age: float | None, now: float, dry_run: bool = False
) -> dict[str, Any]:
    """Remove entries unused for ``max_age`` seconds, then the least recently used down to
    ``max_size`` bytes. Header manifests go by the same rules (every look-up of their source
    reads them, so their last use is as telling); ``removed`` counts entries as ``ls`` lists
    them, ``manifests_removed`` the manifests. ``dry_run``: count, remove nothing."""
    entries = sorted(cache.iter_entries(), key=lambda e: e.atime)  # LRU first
    removed = manifests = freed = 0

    def drop(e: EntryInfo) -> int:
        nonlocal removed, manifests, freed
        got = e.size + _sidecar_size(e) if dry_run else cache.remove_entry(e.name, evicted=True)
        freed += got
        if is_manifest(e):
            manifests += 1
        else:
            removed += 1
        return got

    kept = []
    for e in entries:
        if max_age is not None and now - e.atime > max_age:
            drop(e)
        else:
            kept.append(e)
    if max_size is not None:
        total = sum(e.size + _sidecar_size(e) for e in kept)
        for e in kept:
            if total <= max_size:
                break
            total -= drop(e)
    return {"removed": removed, "manifests_removed": manifests, "freed_bytes": freed, "dry_run": dry_run}


def _sidecar_size(entry: EntryInfo) -> int:
    try:
        return os.path.getsize(entry.path + ".meta")
    except OSError:
        return 0
