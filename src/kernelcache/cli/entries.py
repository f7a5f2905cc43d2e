"""What the listing and maintenance tools do to a FileStreamProgramCache directory."""

from __future__ import annotations

import collections
import datetime as _dt
import hashlib
import os
import re
import time
from typing import Any

from kernelcache.stores.file import lru
from kernelcache.stores.file.ops import open_regular, read_fd, read_regular, sweep_dead_temps
from kernelcache.stores.file.sidecar import MAX_SIZE, is_other_format
from kernelcache.stores.file.store import DEFAULT_TMP_MAX_AGE_S, EntryInfo, FileStreamProgramCache

_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """'30d' -> seconds; ValueError with the accepted forms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if m is None:
        raise ValueError(f"bad age {text!r}: use a number and a unit s/m/h/d/w, e.g. 30d or 12h")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]


def when(ts: float | None, short: bool = False) -> str:
    """Local time of ts; ``short`` (for tables that must fit 80 columns): month-day hour:minute."""
    if ts is None:
        return ""
    return _dt.datetime.fromtimestamp(ts).strftime("%m-%d %H:%M" if short else "%Y-%m-%d %H:%M:%S")


def is_manifest(entry: EntryInfo) -> bool:
    """A bookkeeping record (a header manifest, a source index), not an artifact ``ls`` lists."""
    meta = (entry.meta or {}).get("meta") or {}
    return meta.get("kind") in ("manifest", "source-index")


# Records that are not a kernel of their own: bookkeeping (header manifests, source indexes,
# CuPy's index) and a Triton kernel's single files, for which its group's one row stands.
_NOT_KERNELS = ("manifest", "source-index", "cupy-index", "triton", "blob")  # blob: stores/bundle/blobs.py


def is_kernel(meta: object) -> bool:
    """Whether a record with this metadata is a kernel as ``ls`` lists it (one row): the one rule
    every count of kernels uses (ls, stats, bundle create/ls/import, the remote tiers).
    Metadata that cannot be read is listed (as ``?``): it is no bookkeeping record of ours."""
    return not isinstance(meta, dict) or meta.get("kind") not in _NOT_KERNELS


def is_listed(entry: EntryInfo) -> bool:
    """Whether ``ls`` lists the entry (is_kernel of its metadata); ``show`` lists the others too."""
    return is_kernel((entry.meta or {}).get("meta") or {})


def _text(value: Any, default: str = "?") -> str:
    return default if value is None or value == "" else str(value)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def entry_row(entry: EntryInfo) -> dict[str, Any]:
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
        # Older sidecars hold repr strings; a mapping write (stores/sniff.py) its arch at the top.
        "arch": _text(options.get("arch") or meta.get("arch"), "").strip("'") or "?",
        # A Triton kernel's row: its group's bytes: the entry's own size where it holds the members,
        # the group_bytes a manifest-style group names (its members are entries of their own).
        "size": int(meta["group_bytes"]) if isinstance(meta.get("group_bytes"), int) else entry.size,
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
    return _sorted([entry_row(e) for e in cache.iter_entries() if is_listed(e)], sort, limit)


def _sorted(rows: list[dict[str, Any]], sort: str, limit: int | None) -> list[dict[str, Any]]:
    key, reverse = _SORTS[sort]
    rows.sort(key=key, reverse=reverse)
    return rows[:limit] if limit else rows


def remote_heads(
    redis_url: str | None = None, object_store: str | None = None, namespace: str = "kernelcache"
) -> tuple[str, list[Any]]:
    """(where, [(name, bytes, time, head)]) of every record of a Redis namespace or a bucket. The
    heads are read unverified (shown, never served: a signed tier lists without its secret);
    ValueError naming the cause when the tier cannot be reached."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the error below says it once
        if redis_url is not None:
            from kernelcache.stores.redis import listing as redis_listing
            from kernelcache.stores.redis.store import RedisProgramCache

            store: Any = RedisProgramCache(redis_url, namespace=namespace, read_only=True)
            found, where = redis_listing.heads(store), f"Redis at {redis_url} namespace {namespace!r}"
        else:
            from kernelcache.stores.object import listing as object_listing
            from kernelcache.stores.object.store import ObjectStoreProgramCache

            store = ObjectStoreProgramCache(str(object_store), read_only=True)
            found, where = object_listing.heads(store), f"the object store {object_store}"
    if found is None:
        raise ValueError(f"{where} was not reached ({store.last_error})")
    return where, found


def remote_rows(heads: list[Any], where: str, sort: str, limit: int | None) -> list[dict[str, Any]]:
    """``ls --redis URL`` / ``ls --object-store URL``: the kernels of a shared tier, as ``ls`` shows a
    disk cache's (last used: when the record was written; a shared tier keeps no read times)."""
    rows = []
    for name, size, when_made, head in heads:
        record = head if isinstance(head, dict) else {}
        info = EntryInfo(name, where, int(record.get("size") or size), when_made, {**record, "created": when_made})
        if is_listed(info):
            rows.append(entry_row(info))
    return _sorted(rows, sort, limit)


def remote_counts(heads: list[Any]) -> dict[str, int]:
    """kernels (as ``ls`` lists them), records and bytes of a shared tier's listing."""
    kernels = sum(1 for *_, head in heads if is_kernel((head or {}).get("meta") if isinstance(head, dict) else None))
    return {"entries": kernels, "records": len(heads), "size_bytes": sum(size for _, size, _, _ in heads)}


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


# Filesystem timestamps come from a coarser clock than time.time() (Linux: the tick, at
# most 10 ms behind), so a file written just after the scan began can carry an mtime up to
# that much before it. No more slack than that: a file damaged a moment before the scan is
# damage. (A network filesystem whose server clock is off relies on the pair lock alone.)
_CLOCK_SLACK_S = 0.01


def verify(cache: FileStreamProgramCache, *, fix: bool, progress: bool) -> dict[str, Any]:
    """Re-hash every entry; find corrupt entries, orphaned sidecars, stale temp files.

    ``checked`` counts entries as ``ls`` lists them (artifacts); header manifests are
    checked too and counted apart (``manifests_checked``).

    Safe on a live cache: what looks like damage is judged again under the
    entry's pair lock (no writer is between its two renames then), and a file younger than
    the scan is never damage (it was written during it). Lock files nobody holds are removed
    with --fix, each under its own lock.
    """
    young = time.time() - _CLOCK_SLACK_S  # files with an mtime past this were written during the scan
    entries = list(cache.iter_entries())
    iterator: Any = progress_lines(entries, "verify") if progress and entries else entries
    # Race: a writer publishes the pair (sidecar, then entry) between our reading the
    # sidecar (iter_entries) and the entry (read_verified): they then disagree. Such a
    # suspect is judged again, both files re-read, under the pair lock.
    suspects = [e.name for e in iterator if read_verified(e) is None]
    manifests = sum(1 for e in entries if is_manifest(e))
    present = {e.name for e in entries}
    # Race: a pair published after iter_entries listed the entries shows a sidecar whose
    # entry is not in `present`. Judged again under the pair lock too (entry there: no orphan).
    lone = [f.name[: -len(".meta")] for f, _ in cache.scan() if f.name.endswith(".meta")]
    lone = [name for name in lone if name not in present]
    # Another version's entries (a sidecar format this one does not know; the read path
    # skips them): reported, never judged, never removed. In a team cache shared by two
    # versions, the older one's maintenance must not delete the newer one's entries.
    other = sorted(n for n in {*suspects, *lone} if _of_other_format(cache.entry_path(n)))
    suspects = [n for n in suspects if n not in other]
    lone = [n for n in lone if n not in other]
    failed: list[str] = []
    corrupt = [n for n in suspects if _judged(cache, n, lambda p: _is_damaged(p, young), fix, failed)]
    orphaned = [n for n in lone if _judged(cache, n, lambda p: _is_orphan(p, young), fix, failed)]
    orphans = [cache.entry_path(n) + ".meta" for n in orphaned]
    stale = [path for path, _ in sweep_dead_temps(cache.tmp_dir, DEFAULT_TMP_MAX_AGE_S, remove=fix)]
    fixed = (len(corrupt) + len(orphans) + len(stale) - len(failed)) if fix else 0
    report: dict[str, Any] = {
        "checked": len(entries) - manifests,
        "manifests_checked": manifests,
        "corrupt": corrupt,
        "orphaned_sidecars": orphans,
        "stale_temps": stale,
        "other_format": other,
        "fixed": fixed,
        "remaining": len(corrupt) + len(orphans) + len(stale) - fixed,
    }
    if fix:
        report["lock_files_removed"] = cache.remove_idle_locks()
    return report


def _judged(cache: FileStreamProgramCache, name: str, judge: Any, fix: bool, failed: list[str]) -> bool:
    """Whether judge(entry path) holds under the pair lock; with fix, the pair is then removed."""
    verdict = False

    def decide(path: str) -> bool:
        nonlocal verdict
        verdict = judge(path)
        return fix and verdict

    try:
        cache.remove_entry(name, only_if=decide)
    except OSError:
        failed.append(name)  # judged damaged, but it could not be removed: it remains
    return verdict


def _of_other_format(path: str) -> bool:
    """Whether the sidecar of the entry at path is a kernelcache sidecar of another format."""
    try:
        return is_other_format(read_regular(path + ".meta", max_size=MAX_SIZE)[0])
    except OSError:
        return False


def _is_damaged(path: str, young: float) -> bool:
    """An entry that fails its check and is older than the scan (under the pair lock)."""
    if _of_other_format(path):
        return False  # written by another version meanwhile: not ours to judge
    try:
        data, st = read_regular(path)
    except FileNotFoundError:
        return False  # removed meanwhile: nothing to judge
    except OSError:
        return True  # not a regular file where an entry should be
    try:
        if max(st.st_mtime, os.lstat(path + ".meta").st_mtime) > young:
            return False  # written during the scan: not damage
    except FileNotFoundError:
        return st.st_mtime <= young  # an old entry without its sidecar
    info = FileStreamProgramCache.read_sidecar_info(path) or {}
    return info.get("size") != len(data) or info.get("sha256") != hashlib.sha256(data).hexdigest()


def _is_orphan(path: str, young: float) -> bool:
    """A sidecar without its entry, older than the scan (under the pair lock)."""
    if _of_other_format(path):
        return False
    try:
        os.lstat(path)
        return False  # its entry is there (published after the listing)
    except FileNotFoundError:
        pass
    try:
        return os.lstat(path + ".meta").st_mtime <= young
    except FileNotFoundError:
        return False


def prune(
    cache: FileStreamProgramCache, max_size: int | None, max_age: float | None, now: float, dry_run: bool = False
) -> dict[str, Any]:
    """Remove entries unused for ``max_age`` seconds, then the least recently used, entries and
    Triton's copies alike, until what counts under the cap is at most ``max_size`` bytes: the
    order and the last-use rule of the store's own eviction (stores/file/lru.py). Header
    manifests go by the same rules (every look-up of their source reads them, so their last use
    is as telling); ``removed`` counts entries as ``ls`` lists them, ``manifests_removed`` the
    manifests, ``copies_removed`` the copies. ``dry_run``: count, remove nothing."""
    manifest = {e.path for e in cache.iter_entries() if is_manifest(e)}
    counts = {"removed": 0, "manifests_removed": 0, "copies_removed": 0, "freed_bytes": 0}

    def drop(c: lru.Candidate) -> int | None:
        if c.copy:
            got = c.nbytes if dry_run else _remove_copy(cache, c)
        else:
            got = c.nbytes if dry_run else cache.remove_entry(os.path.basename(c.path), evicted=True)
        if got is None:
            return None
        counts["copies_removed" if c.copy else "manifests_removed" if c.path in manifest else "removed"] += 1
        counts["freed_bytes"] += got
        return got

    candidates, total = cache.lru_candidates()
    kept: collections.deque[lru.Candidate] = collections.deque()
    for c in candidates:
        if max_age is not None and not c.copy and now - c.last_used_ns / 1e9 > max_age:
            total -= drop(c) or 0
        else:
            kept.append(c)
    if max_size is not None:
        lru.take(kept, total, max_size, drop)
    return {**counts, "dry_run": dry_run}


def _remove_copy(cache: FileStreamProgramCache, c: lru.Candidate) -> int | None:
    got = lru.remove_copy(c)
    if got:
        cache.copies_freed(got)
    return got
