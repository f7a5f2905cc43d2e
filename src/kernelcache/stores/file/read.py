"""How FileStreamProgramCache reads an entry: the pair (artifact, sidecar) checked as one.

A reader takes no lock. It reads the artifact, then its sidecar, and serves the pair only if
the sidecar's check (header and metadata) matches the bytes read. A mismatch is either a
writer caught between its two renames (retried) or damage (removed under the pair lock, and
only if both files are still the ones judged). Pairs already verified by this process are
remembered by file identity, so a hit re-reads the artifact's bytes but not the sidecar, and
their payloads are kept (payloads.py): while the entry file is still that very file, a hit is
one lstat and no read at all.
"""

from __future__ import annotations

import os
import stat as stat_mod
import time
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from kernelcache.log import WarnOnce, logger
from kernelcache.memo import remember
from kernelcache.regular_file import open_regular as open_regular_file
from kernelcache.stats import ErrorCause
from kernelcache.stores.base import Meta
from kernelcache.stores.file import lru
from kernelcache.stores.file.ops import (
    TMP_SUFFIX,
    NotRegularFileError,
    StatKey,
    pair_lock,
    read_fd,
    read_regular,
    stat_key,
    unlink_if_same,
)
from kernelcache.stores.file.payloads import Payloads
from kernelcache.stores.file.sidecar import MAX_SIZE, META_SUFFIX, parse_sidecar, sidecar_info
from kernelcache.stores.file.sizecap import SizeCap
from kernelcache.timestamps import now_ns

# Verified (entry, sidecar) pairs remembered per process (see _read_at); bounded.
_VERIFIED_MEMO_SIZE = 4096
# entry identity, sidecar identity, payload CRC-32, parsed metadata
Verified = tuple[StatKey, StatKey, int, Meta]


class EntryInfo(NamedTuple):
    """One entry as found on disk (for listing tools; no payload read). A NamedTuple, not a
    frozen dataclass: making that class costs every import of the store half a millisecond."""

    name: str  # the file name: hex digest of the key
    path: str
    size: int
    atime: float  # its last use (lru.last_used_ns: the stamp on its sidecar, or its atime if later)
    meta: Meta | None  # the sidecar's record, None if missing/unreadable


class EntryReading:
    """The read half of FileStreamProgramCache (a mixin: the store provides the state below)."""

    read_chunk_bytes: int
    _verified: dict[str, Verified]
    _payloads: Payloads
    _touch: bool
    _warned: WarnOnce
    _sizecap: SizeCap

    if TYPE_CHECKING:  # provided by the store (and RecordStore); not defined here, so not overridden

        def _entry_path(self, key: bytes) -> str: ...

        def scan(self) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]: ...

        def warn_once(self, cause: str, message: str, *, counted_as: ErrorCause) -> None: ...

    def _read(self, key: bytes) -> tuple[bytes, Meta] | None:
        return self._read_at(self._entry_path(key))

    def _read_at(self, path: str) -> tuple[bytes, Meta] | None:
        kept = self._payloads.get(path, self._touch)  # verified here, and still that very file
        if kept is not None:
            return kept
        read_ns = now_ns()  # before the read: what the racy rule measures from (payloads.py)
        got = self._read_entry(path)
        if got is None:
            return None
        payload, st = got
        # Fast path: this process already verified this exact pair of files (same inode,
        # size and mtime for both: any os.replace makes a new inode). A stat of the
        # sidecar replaces its read and parse; the payload's CRC is still checked on
        # every read, so damage to the entry itself is always caught.
        known = self._verified.get(path)
        if (
            known is not None
            and known[0] == (st.st_ino, st.st_size, st.st_mtime_ns)
            and known[2] == zlib.crc32(payload)
        ):
            try:
                side = os.lstat(path + META_SUFFIX)
            except OSError:
                side = None
            if side is not None and (side.st_ino, side.st_size, side.st_mtime_ns) == known[1]:
                stamped = self._stamp(path, side, known)
                self._payloads.put(path, st, read_ns, payload, known[3], stamped, side.st_size)
                return payload, known[3]
        return self._read_pair(path, payload, st, read_ns)

    def _read_pair(self, path: str, payload: bytes, st: os.stat_result, read_ns: int) -> tuple[bytes, Meta] | None:
        """The entry's bytes (just read, ``st`` its fstat) checked against its sidecar, read and
        parsed (retried while a writer is between its two renames; a pair damaged twice alike
        is removed)."""
        previous = None
        st_key = stat_key(st)
        for attempt in range(3):
            if attempt:
                read_ns = now_ns()
                got = self._read_entry(path)
                if got is None:
                    return None
                payload, st = got
                st_key = stat_key(st)
            got_sidecar = self._read_sidecar(path)
            if got_sidecar is False:
                return None
            sidecar, sidecar_st = got_sidecar
            sidecar_key = stat_key(sidecar_st) if sidecar_st is not None else None
            # The sidecar's own check covers its header AND its metadata: a flipped bit in the
            # symbol mapping or a cut-off log is as much a mismatch as a damaged artifact.
            header, meta = parse_sidecar(sidecar)
            if meta is not None and header == (len(payload), zlib.crc32(payload)):
                assert sidecar_st is not None
                verified = (st_key, stat_key(sidecar_st), header[1], meta)
                self._remember_verified(path, verified)
                stamped = self._stamp(path, sidecar_st, verified)
                self._payloads.put(path, st, read_ns, payload, meta, stamped, sidecar_st.st_size)
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
                if self._remove_corrupt(path, st_key, sidecar_key):
                    return None
                identity = None  # a writer replaced the pair meanwhile: judge it afresh
            previous = identity
            time.sleep(0.001 * attempt)
        return None  # files kept changing under us: a miss, not a corruption

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Every entry with its sidecar record (for ls/show/verify/prune); payloads are not read."""
        for f, st in self.scan():
            # Only regular files: a FIFO or symlink planted in the tree is no entry of ours
            # (and reading it could hang the tool).
            if f.name.endswith((META_SUFFIX, TMP_SUFFIX)) or not stat_mod.S_ISREG(st.st_mode):
                continue
            info, side = self._sidecar_of(f.path)
            yield EntryInfo(f.name, f.path, st.st_size, lru.last_used_ns(st, side) / 1e9, info)

    @staticmethod
    def _sidecar_of(path: str) -> tuple[dict[str, Any] | None, os.stat_result | None]:
        try:
            raw, st = read_regular(path + META_SUFFIX, max_size=MAX_SIZE)
        except OSError:
            return None, None
        return sidecar_info(raw), st

    @staticmethod
    def read_sidecar_info(path: str) -> dict[str, Any] | None:
        """What the sidecar of the entry at path says, if it passes its check; else None."""
        return EntryReading._sidecar_of(path)[0]

    def _remember_verified(self, path: str, item: Verified) -> None:
        remember(self._verified, path, item, _VERIFIED_MEMO_SIZE)  # a miss costs one sidecar read

    def _stamp(self, path: str, sidecar: os.stat_result, verified: Verified) -> int:
        """Record this hit as the entry's last use (lru.py: the sidecar's mtime, at most once a
        second), and remember the stamped sidecar as the one verified (same inode: only its
        times changed) so that the next hit needs no sidecar read either. The time of the
        entry's last stamp: now, or the sidecar's mtime where none was due (or none is made)."""
        now = time.time_ns()
        if not self._touch or not lru.due(sidecar.st_mtime_ns, now):
            return sidecar.st_mtime_ns
        side_path = path + META_SUFFIX
        if not lru.stamp(side_path):
            if self._warned.first("stamp"):  # a note, not a failure: the hit is served
                logger.info(
                    "cannot record the use of %s (its sidecar is not writable by this user: written by "
                    "another member before sidecars were group-writable, or a read-only mount); its LRU "
                    "time moves only when its owner reads it",
                    side_path,
                )
            return now  # tried: not again before the next one is due
        try:
            after = os.lstat(side_path)
        except OSError:
            return now
        # Race: a writer may have replaced the pair since we verified it: another inode, then,
        # which the next hit reads and checks in full.
        if after.st_ino == sidecar.st_ino and after.st_size == sidecar.st_size:
            self._remember_verified(path, (verified[0], stat_key(after), verified[2], verified[3]))
        return now

    def _read_entry(self, path: str) -> tuple[bytes, os.stat_result] | None:
        """(payload, fstat) of the entry at path; None if absent. Its use is stamped on its
        sidecar once the pair checks out (_stamp); with touch_on_read=False its atime is kept
        too where the kernel allows (O_NOATIME: the owner)."""
        try:
            if not self._touch:
                return read_regular(path, chunk=self.read_chunk_bytes, keep_atime=True)
            # ops.read_regular inlined (every hit): the same open_regular, one read, a close.
            fd, st = open_regular_file(path)
            try:
                return read_fd(fd, st.st_size, self.read_chunk_bytes), st
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._unreadable(path, exc)
            return None

    def _read_sidecar(self, path: str) -> tuple[bytes | None, os.stat_result | None] | Literal[False]:
        """(raw sidecar, its fstat); (None, None) if missing (the entry is then
        unusable); False when it cannot be read or is not a regular file (already warned)."""
        try:
            raw, st = read_regular(path + META_SUFFIX, max_size=MAX_SIZE)
        except FileNotFoundError:
            # The sidecar goes in before the entry and out after it, so an entry without a
            # sidecar is damage (or a remover mid-way; the retry in _read tells them apart).
            return None, None
        except OSError as exc:
            self._unreadable(path + META_SUFFIX, exc)
            return False
        return raw, st

    def _unreadable(self, path: str, exc: OSError) -> None:
        # Not proof of damage in our own format (a FIFO, a symlink, a permission problem):
        # a miss, and the file is left where it is.
        if isinstance(exc, NotRegularFileError):
            self.warn_once(
                "not-regular",
                f"{path} {exc.strerror}; not read (treated as a miss) and left in place: "
                "something other than kernelcache put it in the cache directory",
                counted_as="read",
            )
        else:
            self.warn_once(f"read-{exc.errno}", f"cannot read {path}: {exc}; treated as a miss", counted_as="read")

    def _remove_corrupt(self, path: str, entry_key: StatKey, sidecar_key: StatKey | None) -> bool:
        """Remove a pair that failed its check twice; False if a writer replaced it meanwhile.

        A reader takes no lock, so two reads can both fall between a writer's two renames
        (new sidecar, old entry) and look like damage. Under the pair lock that writer has
        finished; the pair is removed only if both files are still the versions we judged.
        """
        removed = 0
        try:
            with pair_lock(os.path.dirname(path)):
                try:
                    sidecar_now: StatKey | None = stat_key(os.lstat(path + META_SUFFIX))
                except FileNotFoundError:
                    sidecar_now = None
                if sidecar_now != sidecar_key:
                    return False
                entry_freed = unlink_if_same(path, entry_key)
                if entry_freed is None:
                    return False  # replaced or removed meanwhile: not ours to judge now
                removed = entry_freed + (unlink_if_same(path + META_SUFFIX, sidecar_key) or 0)
        except OSError as exc:
            message = f"could not remove the damaged cache entry {path}: {exc}"
            self.warn_once(f"remove-{exc.errno}", message, counted_as="remove")
            return True
        finally:
            self._sizecap.freed(removed)
            self._verified.pop(path, None)
        self.warn_once(
            "corrupt",
            f"cache entry {os.path.basename(path)} failed its integrity check (truncated, "
            "modified or missing its sidecar); removed it, it will be recompiled",
            counted_as="corrupt",
        )
        return True
