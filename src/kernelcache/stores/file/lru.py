"""Least recently used first: what a file's last use is, who may record it, and the one order in
which every removal for room takes files (the size cap's eviction, ``kernelcache prune``, the
copies handed to Triton). One budget: entries and copies are candidates of one order, under
the store's one cap.

**The stamp.** An entry's last use is its sidecar's mtime, which every read sets to now (at most
once a second per entry: a hot entry is not stamped on each hit), or the entry file's own atime
where that is later (an entry of an earlier version, stamped by atime; a mount that keeps
atimes). Why the sidecar's mtime, set with ``utime(path, None)``:

- ``utime`` with explicit times needs the file's owner (POSIX utimensat: EPERM otherwise), so a
  team member could never move the LRU time of another member's entry: entries the team used
  every day looked stale and went first. ``utime(None)`` (both times to now) needs only write
  permission, and a team cache's sidecars are made group-writable when written, whatever the
  writer's umask (the artifact itself keeps its umask's mode: readers verify it by its sidecar).
- atime alone is not kept by every mount (``noatime``), moves on plain reads by any tool
  (``relatime``), and cannot be left alone by a reader that is not the owner (O_NOATIME).
- a stamp file per entry would be one more inode per kernel (Triton counts them).

A stamp changes nothing a reader checks: the sidecar's content has its own CRC, and a process
that remembered the pair by identity (stores/file/read.py) reads the stamped sidecar once more.

**Copies** under ``<root>/materialized/`` (integrations/materialized.py) count with their own
bytes, and their last use is their mtime (bumped each time one is handed out). A copy that is a
hard link to an entry (the same inode) costs nothing of its own while the entry is there: a
file's bytes count once, with its last link (``freed``).
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from kernelcache.regular_file import holds_sha256_prefix
from kernelcache.stores.file.marker import COPIES_DIR
from kernelcache.stores.file.ops import StatKey, freed, scan_shards, stat_key
from kernelcache.stores.file.sidecar import META_SUFFIX

STAMP_GRANULARITY_NS = 1_000_000_000  # a read stamps an entry at most this often
COPY_MIN_AGE_S = 5.0  # a copy younger than this is never taken for room: Triton is about to open it
# Compiled on first use (re caches it), not at import: only copies and eviction need it.
_COPY_NAME = r"[0-9a-f]{32}(-.+|\.tmp)"


def last_used_ns(entry: os.stat_result, sidecar: os.stat_result | None) -> int:
    """An entry's last use: its sidecar's stamp or its own atime, whichever is later."""
    return max(entry.st_atime_ns, sidecar.st_mtime_ns if sidecar is not None else 0)


def due(stamp_ns: int, now_ns: int) -> bool:
    """Whether a stamp made at ``stamp_ns`` is old enough to be made again (or lies in the future)."""
    return not 0 <= now_ns - stamp_ns < STAMP_GRANULARITY_NS


def stamp(sidecar: str) -> bool:
    """Set the sidecar's times to now (the entry was just used); False when this process may not
    (a sidecar of another member written before sidecars were group-writable; a read-only mount).
    Never follows a symlink (what a sidecar path holds is not always ours)."""
    try:
        os.utime(sidecar, follow_symlinks=False)
        return True
    except OSError:
        return False


class Candidate(NamedTuple):
    """One file removal for room may take: an entry (with its sidecar) or a copy. (A NamedTuple:
    a frozen dataclass costs every import of the store half a millisecond to make.)"""

    last_used_ns: int
    path: str
    key: StatKey  # the file version the scan saw: a file replaced or used since is not taken
    nbytes: int  # what taking it frees (with its sidecar's bytes)
    copy: bool = False


def remove_copy(c: Candidate) -> int | None:
    """Take the copy ``c`` if it still is what the scan saw and what its name says (its content
    hashes to the digest its name starts with: no file kernelcache did not write is removed),
    and was not handed out meanwhile; the bytes it gave back, None when it stays.

    Race: a process hands a copy out by bumping its mtime. Checked again after the hash (which
    reads the whole copy: the long moment of this removal); what remains is the moment between
    that look and the unlink, after which the path names no file and Triton compiles again or
    fails to open it: never other bytes (a copy's path is named by its content)."""
    try:
        st = os.lstat(c.path)
        if stat_key(st) != c.key or st.st_mtime_ns != c.last_used_ns or not holds_its_digest(c.path):
            return None
        if os.lstat(c.path).st_mtime_ns != c.last_used_ns:
            return None  # handed out while we read it
        os.unlink(c.path)
    except OSError:
        return None
    return freed(st)


def holds_its_digest(path: str) -> bool:
    """Whether the regular file at ``path`` (``<32 hex>-<name>``) holds bytes whose SHA-256 begins
    with those 32 hex digits (read without following a link, never waiting on a FIFO)."""
    name = os.path.basename(path)
    if not re.fullmatch(_COPY_NAME, name) or name.endswith(".tmp"):
        return False
    return holds_sha256_prefix(path, name[:32])


def scan(entries: str, tmp: str, root: str) -> tuple[deque[Candidate], int]:
    """(every entry and copy, least recently used first; the bytes that count under the cap).

    The bytes are tmp/'s, the entries' and sidecars', and the copies' own. tmp/ is scanned first:
    a staged file published during the scan is then counted twice rather than missed (the total
    errs high, never low)."""
    total = _dir_bytes(tmp)  # staged files, live or dead, take room too
    found: list[Candidate] = []
    sidecars: dict[str, os.stat_result] = {}
    files: list[tuple[str, os.stat_result]] = []
    for f, st in scan_shards(entries):
        total += freed(st) if not f.name.endswith(META_SUFFIX) else st.st_size
        if f.name.endswith(META_SUFFIX):
            sidecars[f.path[: -len(META_SUFFIX)]] = st
        elif stat_mod.S_ISREG(st.st_mode):
            files.append((f.path, st))
    for path, st in files:
        side = sidecars.get(path)
        nbytes = freed(st) + (side.st_size if side is not None else 0)
        found.append(Candidate(last_used_ns(st, side), path, stat_key(st), nbytes))
    copies, copy_bytes = scan_copies(root)
    found += copies
    found.sort(key=lambda c: (c.last_used_ns, c.path))
    return deque(found), total + copy_bytes


def scan_copies(root: str) -> tuple[list[Candidate], int]:
    """The copies under ``<root>/materialized`` (named as materialize names them), and the bytes
    of their own that every file there takes (staged ones too)."""
    out, total = [], 0
    for dirpath, _, filenames in os.walk(os.path.join(root, COPIES_DIR)):
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            total += freed(st)
            if stat_mod.S_ISREG(st.st_mode) and re.fullmatch(_COPY_NAME, name) and not name.endswith(".tmp"):
                out.append(Candidate(st.st_mtime_ns, path, stat_key(st), freed(st), copy=True))
    return out, total


def take(
    candidates: deque[Candidate], total: int, target: int, remove: Callable[[Candidate], int | None]
) -> tuple[int, int]:
    """Remove candidates, least recently used first, until ``total`` is at most ``target``:
    (the total after, how many were taken). ``remove(c)`` returns the bytes it freed, or None
    when it left the file (used or replaced since the scan, too young); an OSError it raises is
    raised after the pass, the others still taken."""
    taken, failed = 0, None
    young = time.time_ns() - int(COPY_MIN_AGE_S * 1e9)
    kept: list[Candidate] = []
    while total > target and candidates:
        c = candidates.popleft()
        if c.copy and c.last_used_ns > young:
            kept.append(c)  # handed out moments ago: Triton is about to open it
            continue
        try:
            got = remove(c)
        except OSError as exc:
            failed = failed or exc
            continue
        if got is not None:
            total -= got
            taken += 1
    candidates.extendleft(reversed(kept))
    if failed is not None:
        raise failed
    return total, taken


def _dir_bytes(directory: str) -> int:
    total = 0
    try:
        with os.scandir(directory) as it:
            for f in it:
                try:
                    total += f.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        pass
    return total
