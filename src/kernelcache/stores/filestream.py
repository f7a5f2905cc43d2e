"""FileStreamProgramCache: artifacts as plain files in a directory shared by many processes.

Layout (see ARCHITECTURE.md; a reader ignores format directories it does not know)::

    <root>/v1/entries/<2 hex>/<64 hex>        the artifact, verbatim (cuobjdump reads it)
    <root>/v1/entries/<2 hex>/<64 hex>.meta   sidecar: JSON with digest, size, metadata
    <root>/v1/tmp/                            staging for atomic writes
    <root>/v1/locks/                          single-flight and eviction locks
    <root>/v1/stats                           counters shared by all processes (stats.FileStats)

Every decision that concerns other processes is explained where it is made.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat as stat_mod
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from kernelcache import config
from kernelcache.memo import remember
from kernelcache.stats import FileStats
from kernelcache.stores.base import Meta, RecordStore, check_max_size
from kernelcache.stores.naming import entry_name

FORMAT_DIR = "v1"
SIDECAR_FORMAT = 1
_META_SUFFIX = ".meta"
_TMP_SUFFIX = ".tmp"
# Crashed writers leave files in tmp/. A live writer finishes in well under a second, so a
# temp file older than this is an orphan. Generous, because a slow network filesystem
# under load must not have its in-flight writes swept.
DEFAULT_TMP_MAX_AGE_S = 15 * 60
# Evict down to this fraction of the cap, not just below it: each eviction pass then frees
# room for many writes, so a full cache pays for a directory scan once per ~10% of its size
# written instead of once per write (cuda.core's rescan-per-write costs O(entries)).
_LOW_WATER = 0.9
# The size tracker drifts when processes race on one key or die mid-way; rescan the
# directory to reset it when the last reconcile is older than this.
_RECONCILE_EVERY_S = 3600
# Errors that mean "this disk will not take it now": drop the write, warn once.
_WRITE_DROP_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS, errno.EPERM, errno.EFBIG}


class UnsafeCacheDirError(PermissionError):
    """The cache root is owned by another user or writable by others."""


def _stat_key(st: os.stat_result) -> tuple[int, int, int]:
    """Identity of one version of a file: a writer's os.replace changes the inode."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _read_fd(fd: int, expected: int) -> bytes:
    """Read a whole regular file: usually one read() of ``expected`` + 1 bytes.

    On a regular file a short read means end of file, so one call suffices unless the file
    is longer than expected (then read on: never return a part as if it were all).
    """
    data = os.read(fd, expected + 1)
    if len(data) <= expected:
        return data
    chunks = [data]
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


_O_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
# Sidecar: one header line the hit path parses without JSON, then the metadata as JSON.
#   kernelcache-sidecar 1 <size> <crc32 hex> <sha256 hex> <created unix time>\n{json}
# The hit path checks size and CRC-32 (zlib, about twice as fast as SHA-256 here); the
# SHA-256 is for tools (verify, export) and for users comparing artifacts across machines.
_SIDECAR_MAGIC = b"kernelcache-sidecar"
# A typical sidecar is a few hundred bytes; _read_fd reads on past this if needed.
_SIDECAR_READ = 1 << 16
# Verified (entry, sidecar) pairs remembered per process (see _read); bounded.
_VERIFIED_MEMO_SIZE = 4096
# entry identity, sidecar identity, payload CRC-32, parsed metadata
_Verified = tuple[tuple[int, int, int], tuple[int, int, int], int, Meta]


def _make_sidecar(payload: bytes, meta: Meta) -> bytes:
    head = b"%s %d %d %08x %s %.6f\n" % (
        _SIDECAR_MAGIC,
        SIDECAR_FORMAT,
        len(payload),
        zlib.crc32(payload),
        hashlib.sha256(payload).hexdigest().encode(),
        time.time(),
    )
    return head + json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def _split_sidecar(raw: bytes | None) -> tuple[list[bytes], bytes] | None:
    """(header fields, meta JSON) of a kernelcache sidecar, or None if it is not one."""
    if not raw:
        return None
    head, _, meta_json = raw.partition(b"\n")
    fields = head.split(b" ")
    if len(fields) < 6 or fields[0] != _SIDECAR_MAGIC:
        return None
    return fields, meta_json


def _parse_sidecar(raw: bytes | None) -> tuple[tuple[int, int] | None, bytes]:
    """((size, crc32), meta JSON) from a sidecar; (None, b"") if unusable, size -1 if unknown format."""
    split = _split_sidecar(raw)
    if split is None:
        return None, b""
    fields, meta_json = split
    if fields[1] != b"%d" % SIDECAR_FORMAT:
        return (-1, 0), b""
    try:
        return (int(fields[2]), int(fields[3], 16)), meta_json
    except ValueError:
        return None, b""


def sidecar_info(raw: bytes) -> dict[str, Any] | None:
    """Everything a sidecar says, for tools: size, crc32, sha256, created, meta."""
    split = _split_sidecar(raw)
    if split is None or split[0][1] != b"%d" % SIDECAR_FORMAT:
        return None
    fields, meta_json = split
    try:
        return {
            "size": int(fields[2]),
            "crc32": fields[3].decode(),
            "sha256": fields[4].decode(),
            "created": float(fields[5]),
            "meta": _load_meta(meta_json),
        }
    except ValueError:
        return None


def _load_meta(meta_json: bytes) -> Meta:
    try:
        meta = json.loads(meta_json) if meta_json else {}
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class EntryInfo:
    """One entry as found on disk (for listing tools; no payload read)."""

    name: str  # the file name: hex digest of the key
    path: str
    size: int
    atime: float
    mtime: float
    meta: Meta | None  # the sidecar's record, None if missing/unreadable


class FileStreamProgramCache(RecordStore):
    """A persistent, multi-process byte store in a directory.

    ``path``: the cache root (default: ``KERNELCACHE_DIR`` or the platformdirs user cache
    dir). ``max_size_bytes``: cap on artifact + sidecar bytes (None: no cap); the least
    recently *read* entries go first. ``allow_shared=True`` accepts a root owned by
    another user or writable by group/others (a team cache); otherwise such a root is
    refused, since anyone who can write it can plant code that your GPU will run.

    Writes are atomic (staged in tmp/, fsync'ed, os.replace'd): readers see the old entry,
    the new one, or none, never a part. Reads verify the sidecar's digest; a mismatch is
    a miss, the bad entry is removed, and one warning is issued. I/O errors never raise
    out of get/set: they become a miss or a dropped write, a warning, and an error count.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_size_bytes: int | None = None,
        *,
        allow_shared: bool = False,
        tmp_max_age_s: float | None = None,
    ) -> None:
        super().__init__()
        self._max_size = check_max_size(max_size_bytes)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        self._root = os.path.abspath(os.fspath(path) if path is not None else config.cache_dir())
        self._allow_shared = allow_shared
        self._tmp_max_age_s = DEFAULT_TMP_MAX_AGE_S if tmp_max_age_s is None else tmp_max_age_s
        base = os.path.join(self._root, FORMAT_DIR)
        self._entries = os.path.join(base, "entries")
        self._tmp = os.path.join(base, "tmp")
        self._locks = os.path.join(base, "locks")
        self._make_dirs(base)
        self._stats = FileStats(os.path.join(base, "stats"))
        self._evict_lock = threading.Lock()
        self._verified: dict[str, _Verified] = {}
        # Oldest-first eviction candidates from the last directory scan: (atime_ns, path,
        # stat key, bytes). Entries written after the scan are newer than all of these,
        # so popping from the left stays LRU order without rescanning per write.
        self._candidates: deque[tuple[int, str, tuple[int, int, int], int]] = deque()
        self._sweep_stale_tmp()
        if self._max_size is not None:
            snap = self._stats.snapshot()
            if time.time() - snap["reconciled_at"] > _RECONCILE_EVERY_S:
                self._reconcile_size()

    # -- directories ------------------------------------------------------------------

    def _make_dirs(self, base: str) -> None:
        # 0700: compiled kernels are code; only their owner should read or plant them.
        os.makedirs(self._root, mode=0o700, exist_ok=True)
        self._check_root_is_safe()
        for d in (base, self._entries, self._tmp, self._locks):
            os.makedirs(d, mode=0o700, exist_ok=True)

    def _check_root_is_safe(self) -> None:
        if self._allow_shared:
            return
        st = os.stat(self._root)
        problem = None
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            problem = f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
        elif st.st_mode & (stat_mod.S_IWGRP | stat_mod.S_IWOTH):
            problem = f"is writable by group or others (mode {stat_mod.filemode(st.st_mode)})"
        if problem:
            raise UnsafeCacheDirError(
                f"kernelcache refuses the cache directory {self._root!r}: it {problem}, so another "
                "user could plant kernels that your process would run. Use a private directory, "
                "or pass allow_shared=True if this is a deliberately shared team cache."
            )

    @property
    def path(self) -> str:
        return self._root

    @property
    def max_size_bytes(self) -> int | None:
        return self._max_size

    def lock_path(self, name: str) -> str:
        """Path of a lock file in locks/ (used by single-flight); the dir is recreated if gone."""
        os.makedirs(self._locks, mode=0o700, exist_ok=True)
        return os.path.join(self._locks, name)

    def _entry_path(self, key: bytes) -> str:
        name = entry_name(key)
        return f"{self._entries}{os.sep}{name[:2]}{os.sep}{name}"

    def entry_path(self, name: str) -> str:
        """Path of the entry file with this 64-hex name."""
        return os.path.join(self._entries, name[:2], name)

    def remove_entry(self, name: str, *, evicted: bool = False) -> int:
        """Remove the entry file ``name`` and its sidecar; return the bytes freed (tools use it)."""
        path = self.entry_path(name)
        freed = self._unlink_if_same(path, None) + self._unlink_if_same(path + _META_SUFFIX, None)
        if freed:
            self._stats.add(size_bytes=-freed, evictions=1 if evicted else 0)
        self._verified.pop(path, None)
        return freed

    @property
    def tmp_dir(self) -> str:
        return self._tmp

    # -- reading ----------------------------------------------------------------------

    def _read(self, key: bytes, want_meta: bool = True) -> tuple[bytes, Meta] | None:
        path = self._entry_path(key)
        previous = None
        for attempt in range(3):
            got = self._read_entry(path)
            if got is None:
                return None
            payload, st_key = got
            # Fast path: this process already verified this exact pair of files (same inode,
            # size and mtime for both: any os.replace makes a new inode). A stat of the
            # sidecar replaces its read and parse; the payload's CRC is still checked on
            # every read, so damage to the entry itself is always caught.
            known = self._verified.get(path)
            if known is not None and known[0] == st_key and known[2] == zlib.crc32(payload):
                try:
                    if _stat_key(os.stat(path + _META_SUFFIX)) == known[1]:
                        return payload, known[3]
                except OSError:
                    pass
            got_sidecar = self._read_sidecar(path)
            if got_sidecar is False:
                return None
            sidecar, sidecar_key = got_sidecar
            header, meta_json = _parse_sidecar(sidecar)
            if header is not None and header[0] == len(payload) and header[1] == zlib.crc32(payload):
                meta = _load_meta(meta_json)
                self._remember_verified(path, (st_key, sidecar_key, header[1], meta))
                return payload, meta
            if header is not None and header[0] < 0:
                return None  # a sidecar format this version does not know: skip, do not judge
            # A mismatch has two causes. (1) A writer replaced the sidecar and the entry of
            # this key between our two reads (it replaces the sidecar first, then the entry,
            # so a reader can pair the new sidecar with the old entry). Retrying resolves it.
            # (2) The entry is corrupt. Only when two reads in a row saw the very same files
            # do we call it corrupt and remove it.
            identity = (st_key, sidecar)
            if identity == previous:
                self._remove_corrupt(path, st_key)
                return None
            previous = identity
            time.sleep(0.001 * attempt)
        return None  # files kept changing under us: a miss, not a corruption

    def _remember_verified(self, path: str, item: _Verified) -> None:
        remember(self._verified, path, item, _VERIFIED_MEMO_SIZE)  # a miss costs one sidecar read

    def _read_entry(self, path: str) -> tuple[bytes, tuple[int, int, int]] | None:
        """(payload, file identity) of the entry at path, with its atime bumped; None if absent."""
        try:
            fd = os.open(path, _O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.warn_once(f"read-{exc.errno}", f"cannot read cache entry {path}: {exc}; treated as a miss")
            return None
        try:
            st = os.fstat(fd)
            payload = _read_fd(fd, st.st_size)
            # Reads alone do not reliably move atime (relatime, noatime mounts), and LRU
            # eviction sorts by atime: set it explicitly, on the open fd, so that a file a
            # writer has meanwhile os.replace'd onto this path is not touched. mtime is kept:
            # it is part of the identity that eviction's stat-guard compares.
            try:
                os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
            except OSError:
                pass  # read-only media: LRU degrades to FIFO, the cache still works
        except OSError as exc:
            self.warn_once(f"read-{exc.errno}", f"cannot read cache entry {path}: {exc}; treated as a miss")
            return None
        finally:
            os.close(fd)
        return payload, (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read_sidecar(self, path: str) -> tuple[bytes | None, Any] | Literal[False]:
        """(raw sidecar, its identity); (None, None) if missing (the entry is then
        unusable); False on an I/O error (already warned)."""
        try:
            fd = os.open(path + _META_SUFFIX, _O_RDONLY)
        except FileNotFoundError:
            # The sidecar goes in before the entry and out after it, so an entry without a
            # sidecar is damage (or a remover mid-way; the retry in _read tells them apart).
            return None, None
        except OSError as exc:
            self.warn_once(f"read-{exc.errno}", f"cannot read sidecar of {path}: {exc}; treated as a miss")
            return False
        try:
            return _read_fd(fd, _SIDECAR_READ), _stat_key(os.fstat(fd))
        except OSError as exc:
            self.warn_once(f"read-{exc.errno}", f"cannot read sidecar of {path}: {exc}; treated as a miss")
            return False
        finally:
            os.close(fd)

    def _remove_corrupt(self, path: str, entry_key: tuple[int, int, int]) -> None:
        removed = self._unlink_if_same(path, entry_key)
        if removed:
            removed += self._unlink_if_same(path + _META_SUFFIX, None)
            self._stats.add(size_bytes=-removed)
        self.warn_once(
            "corrupt",
            f"cache entry {os.path.basename(path)} failed its integrity check (truncated, "
            "modified or missing its sidecar); removed it, it will be recompiled",
        )

    @staticmethod
    def _unlink_if_same(path: str, key: Any) -> int:
        """Unlink path if it is still the file version ``key``; return the bytes freed.

        The stat-then-unlink pair leaves a window of microseconds in which another process
        can os.replace a fresh file onto ``path``; we would then delete that fresh entry.
        The cost is one recompile, never a wrong result, so we accept it rather than take a
        lock on every write.
        """
        try:
            st = os.stat(path)
        except OSError:
            return 0
        if key is not None and _stat_key(st) != key:
            return 0
        try:
            os.unlink(path)
        except OSError:
            return 0
        return st.st_size

    # -- writing ----------------------------------------------------------------------

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        path = self._entry_path(key)
        sidecar = _make_sidecar(payload, meta)
        if self._max_size is not None and len(payload) + len(sidecar) > self._max_size:
            # Storing it would evict every other entry and still exceed the cap.
            self.warn_once(
                "too-large",
                f"an entry of {len(payload)} bytes exceeds max_size_bytes={self._max_size}; not stored on disk",
            )
            return False
        staged: list[str] = []
        try:
            # Only the entry is fsync'ed. A sidecar lost or garbled by a power cut fails the
            # CRC check on read, which makes the entry a miss: the verification that every
            # read does already covers it, and a second fsync would double a write's cost.
            meta_tmp = self._stage(sidecar, durable=False)
            staged.append(meta_tmp)
            entry_tmp = self._stage(payload)
            staged.append(entry_tmp)
            old = self._size_of_pair(path)
            # Sidecar first, entry second: a reader that sees the new entry is guaranteed
            # to find a sidecar at least as new. (The reverse pairing -- new sidecar, old
            # entry -- is caught by the digest check and retried in _read.)
            self._publish(meta_tmp, path + _META_SUFFIX)
            self._publish(entry_tmp, path)
            staged.clear()
        except OSError as exc:
            self.warn_once(
                f"write-{exc.errno}",
                f"could not write to the cache at {self._root}: {exc}; the entry was not stored "
                "(compiles still work, they are just not cached)",
            )
            return False
        finally:
            for leftover in staged:
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
        # The tracker moves by this write's net delta: O(1), no directory walk. A racing
        # writer of the same key can make `old` stale; the periodic reconcile absorbs that.
        after = self._stats.add(size_bytes=len(payload) + len(sidecar) - old)
        if self._max_size is not None and after["size_bytes"] > self._max_size:
            self._evict()
        return True

    def _stage(self, data: bytes, durable: bool = True) -> str:
        """Write data to a fresh temp file (fsync'ed if durable), return its path."""
        name = os.path.join(self._tmp, f"{uuid.uuid4().hex}{_TMP_SUFFIX}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(name, flags, 0o600)
        except FileNotFoundError:
            # Someone deleted tmp/ (or the whole v1/) under a live cache: recreate it.
            os.makedirs(self._tmp, mode=0o700, exist_ok=True)
            fd = os.open(name, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            # fsync before publication: after a power loss the entry is either absent or
            # whole, never an allocated-but-unwritten file with a valid name.
            if durable:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            os.unlink(name)
            raise
        os.close(fd)
        return name

    def _publish(self, tmp: str, target: str) -> None:
        try:
            os.replace(tmp, target)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            # The two-hex subdirectory does not exist yet (or clear() removed it).
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            os.replace(tmp, target)

    @staticmethod
    def _size_of_pair(path: str) -> int:
        total = 0
        for p in (path, path + _META_SUFFIX):
            try:
                total += os.stat(p).st_size
            except OSError:
                pass
        return total

    # -- size cap ---------------------------------------------------------------------

    def _evict(self) -> None:
        """Bring the tracked size down to the low-water mark, least recently read first."""
        # One evictor per process (thread lock) and one per directory (a file lock taken
        # without waiting): if another process is already evicting, our write is done and
        # that process frees the room.
        if not self._evict_lock.acquire(blocking=False):
            return
        try:
            import filelock

            lock = filelock.FileLock(self.lock_path("evict.lock"))
            try:
                lock.acquire(timeout=0)
            except filelock.Timeout:
                return
            try:
                self._evict_locked()
            finally:
                lock.release()
        except OSError as exc:
            self.warn_once(f"evict-{exc.errno}", f"eviction failed in {self._root}: {exc}")
        finally:
            self._evict_lock.release()

    def _evict_locked(self) -> None:
        assert self._max_size is not None
        target = int(self._max_size * _LOW_WATER)
        size = self._stats.snapshot()["size_bytes"]
        evicted = 0
        rescanned = False
        while size > target:
            if not self._candidates:
                if rescanned:
                    break  # everything left is newer than the scan, or is being rewritten
                size = self._reconcile_size()
                rescanned = True
                continue
            atime_ns, path, key, nbytes = self._candidates.popleft()
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            # Stat guard: evict only the exact file version that the scan saw, unread since.
            # A different inode/size/mtime means a writer replaced it; a newer atime means a
            # reader used it: either way it is no longer a least-recently-used entry.
            if _stat_key(st) != key or st.st_atime_ns != atime_ns:
                continue
            freed = self._unlink_if_same(path, key)
            if freed:
                freed += self._unlink_if_same(path + _META_SUFFIX, None)
                size -= freed
                evicted += 1
                self._stats.add(size_bytes=-freed)
        if evicted:
            self._stats.add(evictions=evicted)

    def _scan(self) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
        try:
            shards = list(os.scandir(self._entries))
        except FileNotFoundError:
            return
        for shard in shards:
            if not shard.is_dir(follow_symlinks=False):
                continue
            try:
                files = list(os.scandir(shard.path))
            except FileNotFoundError:
                continue
            for f in files:
                try:
                    yield f, f.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue

    def _reconcile_size(self) -> int:
        """Rescan entries/: reset the size tracker and refill the eviction candidates."""
        total = 0
        found = []
        meta_sizes: dict[str, int] = {}
        for f, st in self._scan():
            total += st.st_size
            if f.name.endswith(_META_SUFFIX):
                meta_sizes[f.path[: -len(_META_SUFFIX)]] = st.st_size
            else:
                found.append((st.st_atime_ns, f.path, _stat_key(st), st.st_size))
        found.sort()
        self._candidates = deque((a, p, k, n + meta_sizes.get(p, 0)) for a, p, k, n in found)
        self._stats.set("size_bytes", total)
        self._stats.set("reconciled_at", int(time.time()))
        return total

    def _sweep_stale_tmp(self) -> None:
        # Age-based, so that temp files of live writers in other processes survive.
        cutoff = time.time() - self._tmp_max_age_s
        try:
            with os.scandir(self._tmp) as it:
                for f in it:
                    try:
                        if f.stat(follow_symlinks=False).st_mtime < cutoff:
                            os.unlink(f.path)
                    except OSError:
                        continue
        except OSError:
            pass

    # -- the rest of the mapping API -------------------------------------------------

    def _remove(self, key: bytes) -> bool:
        path = self._entry_path(key)
        freed = self._unlink_if_same(path, None)
        freed_meta = self._unlink_if_same(path + _META_SUFFIX, None)
        if freed or freed_meta:
            self._stats.add(size_bytes=-(freed + freed_meta))
        return bool(freed or freed_meta)

    def __len__(self) -> int:
        return sum(1 for f, _ in self._scan() if not f.name.endswith((_META_SUFFIX, _TMP_SUFFIX)))

    def clear(self) -> None:
        """Remove every entry (other processes' in-flight writes may land afterwards)."""
        for f, _ in self._scan():
            try:
                os.unlink(f.path)
            except OSError:
                pass
        self._candidates.clear()
        self._stats.set("size_bytes", 0)

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry with its sidecar record (for ls/show/verify); payloads are not read."""
        for f, st in self._scan():
            if f.name.endswith((_META_SUFFIX, _TMP_SUFFIX)):
                continue
            meta = None
            try:
                with open(f.path + _META_SUFFIX, "rb") as fh:
                    meta = sidecar_info(fh.read())
            except OSError:
                pass
            yield EntryInfo(f.name, f.path, st.st_size, st.st_atime, st.st_mtime, meta)

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        out["max_size_bytes"] = self._max_size or 0
        out["persistent_stats"] = int(self._stats.persistent)
        return out

    def close(self) -> None:
        self._stats.close()
