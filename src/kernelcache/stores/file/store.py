"""FileStreamProgramCache: artifacts as plain files in a directory shared by many processes.

Layout (a reader ignores format directories it does not know)::

    <root>/v2/entries/<2 hex>/<name>          the artifact, verbatim (cuobjdump reads it)
    <root>/v2/entries/<2 hex>/<name>.meta     sidecar: header line + JSON metadata (sidecar.py)
    <root>/v2/tmp/                            staging for atomic writes
    <root>/v2/locks/                          single-flight and eviction locks
    <root>/v2/stats                           counters shared by all processes (stores.file.counters)

``<name>`` is naming.entry_name(key): one domain-separated digest for every key. Layout v1
(a 32-byte key named by its own hex, any other by its SHA-256, so K and sha256(K) shared an
entry; a sidecar whose metadata was not checked) is never read: its entries are a miss, and
``kernelcache clear`` / ``prune`` remove the files it wrote (remove_old_layouts, oldlayout.py).

Every decision that concerns other processes is explained where it is made. The sidecar
format is sidecar.py, reading and judging an entry pair read.py, size tracking and eviction
sizecap.py, the file operations ops.py, the lock files locks.py, who may own and write the
tree treesafety.py, the counters counters.py.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from kernelcache import config, forksafe
from kernelcache.memo import remember
from kernelcache.stores.base import Meta, RecordStore, check_max_size
from kernelcache.stores.file import dircap, lru
from kernelcache.stores.file import locks as lockfiles
from kernelcache.stores.file.counters import FileStats
from kernelcache.stores.file.marker import FORMAT_DIR, TIER_COUNTERS, holds_only_ours, tier_counters_path
from kernelcache.stores.file.ops import (
    READ_CHUNK,
    TMP_SUFFIX,
    pair_lock,
    path_in,
    publish,
    scan_shards,
    size_of,
    stage_held,
    sweep_dead_temps,
    unlink_if_same,
)
from kernelcache.stores.file.payloads import Payloads
from kernelcache.stores.file.read import EntryInfo, EntryReading, Verified
from kernelcache.stores.file.sidecar import META_SUFFIX, is_entry_file_name, make_sidecar
from kernelcache.stores.file.sizecap import SizeCap
from kernelcache.stores.file.treesafety import UnsafeCacheDirError, make_root, make_tree
from kernelcache.stores.naming import entry_name

__all__ = ["DEFAULT_TMP_MAX_AGE_S", "EntryInfo", "FileStreamProgramCache", "UnsafeCacheDirError"]

# Crashed writers leave files in tmp/. A live writer finishes in well under a second, so a
# temp file older than this is an orphan. Generous, because a slow network filesystem
# under load must not have its in-flight writes swept.
DEFAULT_TMP_MAX_AGE_S = 15 * 60


# Entry paths by key remembered per store (see _entry_path); bounded.
_PATH_MEMO_SIZE = 4096
_PATH_MEMO_KEY_MAX = 256


# Records staged without an fsync: after a power cut such a record is gone or fails its CRC on
# read, and what that costs is a compile, never a wrong hit. A source's index names its entries
# to explain a later miss (compile/sourceindex.py; no hit reads it); header bookkeeping (kind
# "manifest": a manifest, the variants it names, a preprocessing hint, headers/manifests.py)
# leads a look-up to an entry, and one lost or torn is a miss whose compile writes it again
# (the entry's key is the same, derived from the headers). A miss then pays one fsync, the
# artifact's, as cuda.core's cache does, instead of three or four.
NOT_DURABLE_KINDS = ("source-index", "manifest")


class FileStreamProgramCache(EntryReading, RecordStore):
    """A persistent, multi-process byte store in a directory.

    ``path``: the cache root (default: ``KERNELCACHE_DIR`` or the platformdirs user cache
    dir). ``max_size_bytes``: cap on artifact + sidecar bytes (None: no cap; by default the cap
    stored in the directory by ``kernelcache config set max-size``, else none); the least
    recently *read* entries go first. ``allow_shared=True`` makes it a team cache: a
    group-writable, setgid tree that every member of its group reads and writes (files by
    umask; an entry a member wrote is as trusted as that member). Otherwise the tree must be
    yours and writable by you only, since anyone who can write it can plant code that your
    GPU will run (default: ``KERNELCACHE_ALLOW_SHARED``). Either way every directory of the
    tree is checked at construction (treesafety.py) and the root is resolved once.
    ``touch_on_read=False``: reads leave the last-used times (and so the eviction order)
    alone, for diagnostics such as ``kernelcache explain``.
    ``create=False``: open for reading only what exists: the root must exist
    (FileNotFoundError) and nothing is created in it (no tree, no counters file, no marker);
    a root without a tree is an empty cache. The reading commands open caches so.

    Writes are atomic (staged in tmp/, fsync'ed, os.replace'd): readers see the old entry,
    the new one, or none, never a part. Reads verify the sidecar's digest; a mismatch is
    a miss, the bad entry is removed, and one warning is issued. I/O errors never raise
    out of get/set: they become a miss or a dropped write, a warning, and an error count.
    The check covers the metadata too (symbol mapping, log...): it decides what runs.
    """

    # At most this many bytes per read() call (a single read stops at about 2 GiB).
    read_chunk_bytes: int = READ_CHUNK

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_size_bytes: int | None | dircap.FromDirectory = dircap.FROM_DIRECTORY,
        *,
        allow_shared: bool | None = None,
        tmp_max_age_s: float | None = None,
        touch_on_read: bool = True,
        create: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(max_size_bytes, dircap.FromDirectory):
            check_max_size(max_size_bytes)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        given = os.path.abspath(os.fspath(path) if path is not None else config.cache_dir())
        self._allow_shared = config.allow_shared() if allow_shared is None else bool(allow_shared)
        self._tmp_max_age_s = DEFAULT_TMP_MAX_AGE_S if tmp_max_age_s is None else tmp_max_age_s
        self._touch = bool(touch_on_read)
        # Resolved once: a symlinked root re-pointed later by its owner must
        # not swap the tree under this store; every path below is built from this one.
        self._root, self._allow_shared = make_root(given, self._allow_shared, create)  # team: a team tree only
        from_dir = isinstance(max_size_bytes, dircap.FromDirectory)
        self._max_size = dircap.cap_of(self._root) if from_dir else max_size_bytes
        base = os.path.join(self._root, FORMAT_DIR)
        self._entries = os.path.join(base, "entries")
        self._tmp = os.path.join(base, "tmp")
        self._locks = os.path.join(base, "locks")
        # The tree is created here if missing, and marked as a cache root first (marker.py)
        # when the root holds nothing but kernelcache's: destructive commands remove nothing
        # under a root without the mark, and backup tools skip a marked root whole.
        fresh = not os.path.lexists(base) and holds_only_ours(self._root)
        subdirs = (base, self._entries, self._tmp, self._locks)
        make_tree(self._root, subdirs, self._allow_shared, mark=fresh, create=create)
        # Files by umask in a team cache (ccache's model); 0600 in a private one.
        self._file_mode = 0o666 if self._allow_shared else 0o600
        self._create = create
        self._stats = FileStats(os.path.join(base, "stats"), shared=self._allow_shared, create=create)
        self._verified: dict[str, Verified] = {}
        self._payloads = Payloads()
        forksafe.reset_in_child(self._payloads)
        self._paths: dict[bytes, str] = {}
        self._sizecap = SizeCap(self._max_size, self._stats, self._entries, self._locks, self._tmp, self._tmp_max_age_s)
        self._sweep_stale_tmp()

    @property
    def path(self) -> str:
        return self._root

    @property
    def file_root(self) -> str:
        return self._root

    @property
    def max_size_bytes(self) -> int | None:
        return self._max_size

    @property
    def team(self) -> bool:
        """Whether this is a team cache (allow_shared and a team tree: group-writable, setgid)."""
        return self._allow_shared

    def lock_path(self, name: str) -> str:
        """Path of a lock file in locks/ (used by single-flight); the dir is recreated if gone."""
        return path_in(self._locks, name)

    def _entry_path(self, key: bytes) -> str:
        # Memoised: the digest of the name is a fixed cost of every hit, and a process
        # asks for the same few keys again and again.
        path = self._paths.get(key)
        if path is None:
            name = entry_name(key)
            path = f"{self._entries}{os.sep}{name[:2]}{os.sep}{name}"
            if len(key) <= _PATH_MEMO_KEY_MAX:  # a caller's huge key is not kept alive
                remember(self._paths, key, path, _PATH_MEMO_SIZE)
        return path

    def entry_path(self, name: str) -> str:
        """Path of the entry file with this 64-hex name."""
        return os.path.join(self._entries, name[:2], name)

    def remove_entry(self, name: str, *, evicted: bool = False, only_if: Callable[[str], bool] | None = None) -> int:
        """Remove the entry file ``name`` and its sidecar; return the bytes freed (0: absent).

        ``only_if(entry_path)``: judged under the pair lock, so no writer publishes this
        pair meanwhile (verify --fix judges damage with it); False keeps both files.
        OSError when a file is there but cannot be removed (permissions, an immutable
        directory): that is not "absent", and the entry may still be served.
        """
        path = self.entry_path(name)
        self._verified.pop(path, None)
        self._payloads.forget(path)
        freed = 0
        try:
            with pair_lock(os.path.dirname(path)):
                if only_if is not None and not only_if(path):
                    return 0
                freed += unlink_if_same(path, None) or 0
                freed += unlink_if_same(path + META_SUFFIX, None) or 0
        finally:
            self._sizecap.freed(freed, evicted=evicted)
        return freed

    def remove_old_layouts(self) -> int:
        """Remove the files of layout v1 (``<root>/v1``); return how many were removed.

        Its entries are never read by this version, so they only take space. Only files
        that layout wrote go (oldlayout.py): anything else under a ``v1/`` stays.
        """
        from kernelcache.stores.file.oldlayout import remove_v1_tree  # maintenance only

        return remove_v1_tree(self._root)

    @property
    def tmp_dir(self) -> str:
        return self._tmp

    @property
    def reads_renew(self) -> bool:
        return self._touch  # a read stamps the last use (lru.py), which eviction goes by

    def tier_counters(self, tier: str) -> FileStats:
        """The counters file of another tier of the default cache built over this directory
        (``v2/stats.<tier>``: memory, bundle, redis, object), shared like this store's own:
        those tiers count this node's look-ups there, where ``kernelcache stats`` reads them."""
        if tier not in TIER_COUNTERS:
            raise ValueError(f"no counters file for a tier named {tier!r}; known: {', '.join(TIER_COUNTERS)}")
        return FileStats(tier_counters_path(self._root, tier), shared=self._allow_shared, create=self._create)

    # -- writing ----------------------------------------------------------------------

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        return self._write_at(self._entry_path(key), payload, meta)

    def read_named(self, name: str) -> tuple[bytes, Meta] | None:
        """The checked (payload, meta) of the entry ``name``, uncounted (``kernelcache import``
        asks whether a record is already there); None: absent or unusable."""
        return self._read_at(self.entry_path(name))

    def write_named(self, name: str, payload: bytes, meta: Meta) -> bool:
        """Store an entry by its name (naming.entry_name of its key), as ``kernelcache import``
        copies one from a bundle; False if the write was dropped (warned)."""
        return self._write_at(self.entry_path(name), payload, meta)

    def _write_at(self, path: str, payload: bytes, meta: Meta) -> bool:
        self._payloads.forget(path)  # what this write replaces is not served from memory again
        sidecar = make_sidecar(payload, meta)
        nbytes = len(payload) + len(sidecar)  # what the cap counts: the artifact and its sidecar
        if self._sizecap.too_large(nbytes):
            # Storing it would evict every other entry and still exceed the cap.
            self.warn_once(
                "too-large",
                f"an entry of {nbytes} bytes with its metadata ({len(payload)} of artifact) exceeds "
                f"max_size_bytes={self._max_size}; not stored on disk",
                counted_as="too_large",
            )
            return False
        try:
            # Counted before staging (the staged files take room too), and room made first
            # if that puts the store over its cap (sizecap.py: the invariant).
            self._sizecap.reserve(nbytes)
        except OSError as exc:
            self._evict_failed(exc)
        staged: list[tuple[str, int]] = []
        old, published = 0, False
        try:
            # Only the entry is fsync'ed. A sidecar lost or garbled by a power cut fails the
            # CRC check on read, which makes the entry a miss: the verification that every
            # read does already covers it, and a second fsync would double a write's cost.
            # Each staged file stays flocked until published: a sweeper takes an unlocked
            # one for a dead writer's leftover (ops.sweep_dead_temps).
            staged.append(stage_held(self._tmp, sidecar, durable=False, mode=self._file_mode))
            if self._allow_shared:  # every member may stamp its last use (lru.py), whatever the umask
                _group_writable(staged[0][1])
            durable = meta.get("kind") not in NOT_DURABLE_KINDS
            staged.append(stage_held(self._tmp, payload, durable=durable, mode=self._file_mode))
            (meta_tmp, _), (entry_tmp, _) = staged
            # The two renames and the measure of what they replace happen under the pair
            # lock: two writers of one key would otherwise interleave them and leave one's
            # entry with the other's sidecar (see ops.pair_lock). Sidecar first, entry
            # second: a reader (it takes no lock) that sees the new entry is guaranteed to
            # find a sidecar at least as new; the reverse pairing -- new sidecar, old entry --
            # fails the check and is retried in _read.
            with pair_lock(os.path.dirname(path)):
                old = size_of(path, path + META_SUFFIX)
                publish(meta_tmp, path + META_SUFFIX)
                publish(entry_tmp, path)
            published = True
        except OSError as exc:
            self.warn_once(
                f"write-{exc.errno}",
                f"could not write to the cache at {self._root}: {exc}; the entry was not stored "
                "(compiles still work, they are just not cached)",
                counted_as="write",
            )
        finally:
            for name, fd in staged:
                os.close(fd)  # releases the flock
                if not published:
                    try:
                        os.unlink(name)
                    except OSError:
                        pass
        # The reservation becomes the entry; what it replaced is gone (or, failed, nothing was added).
        self._sizecap.settle(-old if published else -nbytes)
        return published

    def _evict_failed(self, exc: OSError) -> None:
        self.warn_once(
            f"evict-{exc.errno}",
            f"could not evict from the cache at {self._root}: {exc}; it stays over its cap "
            f"({self._max_size} bytes) until that entry can be removed",
            counted_as="remove",
        )

    # -- scanning and maintenance -------------------------------------------------------

    def scan(self) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
        """Every file under entries/ (artifacts, sidecars, anything else) with its lstat.

        For tools and counting; files that vanish during the scan are skipped.
        """
        return scan_shards(self._entries)

    def _sweep_stale_tmp(self) -> None:
        # Leftovers of dead writers (their staged files are no longer flocked) and old
        # files of any other kind; a live writer's file is never touched. Eviction sweeps too.
        # tmp_max_age_s=inf: no sweep at open (verify opens so, to report the leftovers).
        if self._tmp_max_age_s == float("inf"):
            return
        try:
            freed = sum(n for _, n in sweep_dead_temps(self._tmp, self._tmp_max_age_s))
        except OSError:
            return
        self._sizecap.settle(-freed)

    def remove_idle_locks(self) -> int:
        """Remove the lock files nobody holds, each under its own lock (locks.py)."""
        return lockfiles.remove_idle(self._locks)

    # -- the rest of the mapping API -------------------------------------------------

    def _remove(self, key: bytes) -> bool:
        return self.remove_entry(entry_name(key)) > 0

    def __len__(self) -> int:
        return sum(1 for f, _ in self.scan() if not f.name.endswith((META_SUFFIX, TMP_SUFFIX)))

    def clear(self) -> None:
        """Remove every entry, dead writers' leftovers and idle lock files (other processes'
        in-flight writes may land afterwards, and are kept)."""
        freed = 0
        for f, _ in self.scan():
            if not is_entry_file_name(f.name):
                continue  # not a file this store writes there: not ours to remove
            # Race: a writer may os.replace a fresh file onto this path after the listing.
            # Only the file the listing saw goes (its inode, fixed when the shard was
            # listed), judged and unlinked under the pair lock that every publisher takes.
            try:
                with pair_lock(os.path.dirname(f.path)):
                    freed += unlink_if_same(f.path, None, inode=f.inode()) or 0
            except OSError:
                pass
        self._verified.clear()
        self._payloads.clear()
        self._sizecap.emptied(freed)
        self._sweep_stale_tmp()
        self.remove_idle_locks()

    def count_copy(self, nbytes: int) -> None:
        """A copy with bytes of its own is about to be written under this root (Triton's copies,
        integrations/materialized.py): counted under this store's one cap, room made first."""
        try:
            self._sizecap.count_copy(nbytes)
        except OSError as exc:
            self._evict_failed(exc)

    def lru_candidates(self) -> tuple[deque[lru.Candidate], int]:
        """Every entry and copy under this root, least recently used first, and the bytes that
        count under the cap (lru.scan): what ``kernelcache prune`` takes, in eviction's order."""
        return lru.scan(self._entries, self._tmp, self._root)

    def copies_swept_at(self, now: float | None = None) -> float:
        """When idle copies under this root were last swept (any process); with ``now``, record
        that they are being swept now. Kept in the counters file: no stamp file of its own."""
        if now is not None:
            self._stats.set("copies_swept_at", int(now))
            return now
        return float(self._stats.snapshot()["copies_swept_at"])

    def copies_freed(self, nbytes: int) -> None:
        """Copies under this root were removed, giving back ``nbytes`` (lru.freed of each)."""
        self._sizecap.freed(nbytes)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["max_size_bytes"] = self._max_size or 0
        out["persistent_stats"] = int(self._stats.persistent)
        return out

    def close(self) -> None:
        self._stats.close()


def _group_writable(fd: int) -> None:
    """Add the group's read and write bits to a file this process just created."""
    mode = stat_mod.S_IMODE(os.fstat(fd).st_mode)
    if mode & 0o060 != 0o060:
        os.fchmod(fd, mode | 0o060)
