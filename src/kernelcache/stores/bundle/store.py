"""BundleProgramCache: a read-only store over one bundle file (format.py).

It writes nothing, takes no lock and creates no directory, so it works on a read-only
filesystem, in a container image layer and as any uid that can read the file. The file is
opened once and read with ``os.pread`` only (no mmap: NFS and overlay filesystems, and no
shared file offset: threads and forked children read through one descriptor safely).
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from typing import Any

from kernelcache.regular_file import NotRegularFileError, open_regular
from kernelcache.stores import record as rec
from kernelcache.stores.base import Meta, RecordStore, ValueLike
from kernelcache.stores.bundle import format as fmt
from kernelcache.stores.file.treesafety import UnsafeCacheDirError
from kernelcache.stores.naming import entry_name


def as_secret(secret: bytes | str | None) -> bytes | None:
    """``secret`` as bytes (str is UTF-8); ValueError for an empty one or another type."""
    if isinstance(secret, str):
        secret = secret.encode()
    if secret is not None and (not isinstance(secret, bytes) or not secret):
        raise ValueError("secret must be non-empty bytes or str, or None")
    return secret


class BundleProgramCache(RecordStore):
    """A read-only ProgramCacheResource over the bundle file at ``path``.

    ``secret``: the bundle must be signed with it (every record's HMAC is checked on
    read); without one, the bundle must be unsigned. A bundle that others than its owner
    (you or root) can write, or in a directory they can write, is refused
    (UnsafeCacheDirError) unless it is signed and ``secret`` is given: it holds code your
    GPU will run. A file that is not a bundle, of another format, or whose index fails its
    check: InvalidBundleError. An entry that fails its check is a miss with one warning.
    Writes raise PermissionError; ``read_only`` is True. ``check_owner=False`` skips the owner
    and mode check only, to check a file's bytes before it is put in place (``bundle pull``
    stages one): it is for checking, not for serving kernels.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, secret: bytes | str | None = None, check_owner: bool = True
    ) -> None:
        super().__init__()
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, not {type(path).__name__}")
        self._secret = as_secret(secret)
        self._check_owner = check_owner
        self.path = os.path.realpath(os.fspath(path))
        try:  # a FIFO is refused, never waited on (the path is resolved: no link is left to follow)
            self._fd = open_regular(self.path, follow=True)[0]
        except NotRegularFileError:
            raise fmt.InvalidBundleError(f"{self.path} is not a regular file") from None
        try:
            self._header, self._index = self._open()
        except BaseException:
            os.close(self._fd)
            raise
        self._close_lock = threading.Lock()

    def _open(self) -> tuple[fmt.Header, bytes]:
        st = os.fstat(self._fd)
        raw = os.pread(self._fd, fmt.HEADER.size, 0)
        header = fmt.parse_header(raw, self.path, st.st_size)
        self._check_trust(header, st)
        blob = _pread_all(self._fd, header.index_length + fmt.TAG_SIZE, header.index_offset)
        index, tag = blob[: header.index_length], blob[header.index_length :]
        if tag != fmt.index_tag(self._secret, raw[: fmt.HEADER.size], index):
            raise fmt.InvalidBundleError(
                f"{self.path} is damaged (its index fails its check): run `kernelcache bundle verify {self.path}`"
            )
        return header, index

    def _check_trust(self, header: fmt.Header, st: os.stat_result) -> None:
        if header.signed and self._secret is None:
            raise ValueError(
                f"{self.path} is a signed bundle: give the secret it was signed with (secret=, the CLI's "
                "--secret-env VAR, KERNELCACHE_BUNDLE_SECRET for KERNELCACHE_BUNDLES)"
            )
        if header.signed and header.key_id != rec.key_id(self._secret):
            raise ValueError(f"{self.path} is signed with another secret than the one given")
        if not header.signed and self._secret is not None:
            raise ValueError(
                f"{self.path} is not signed, and with secret= only bundles signed with it are accepted: "
                "sign it (`kernelcache bundle create --secret-env VAR`) or pass no secret"
            )
        if header.signed or not self._check_owner:
            return  # every record is checked against the secret: who can write the file does not matter
        for where, info in ((self.path, st), (os.path.dirname(self.path), os.stat(os.path.dirname(self.path)))):
            problem = _writable_by_others(info, directory=where != self.path)
            if problem:
                raise UnsafeCacheDirError(
                    f"kernelcache refuses the bundle {self.path}: {where} {problem}, so another user could "
                    "plant kernels that your process would run. Make it writable by its owner only "
                    "(chmod go-w), or sign the bundle and pass its secret"
                )

    # -- reads -----------------------------------------------------------------------------

    def _slot(self, name: bytes) -> tuple[int, int] | None:
        """(offset, length) of the record named ``name`` (binary), by binary search."""
        index, size = self._index, fmt.SLOT.size
        lo, hi = 0, self._header.count
        while lo < hi:
            mid = (lo + hi) // 2
            at = mid * size
            here = index[at : at + 32]
            if here < name:
                lo = mid + 1
            elif here > name:
                hi = mid
            else:
                _, offset, length = fmt.SLOT.unpack_from(index, at)
                return offset, length
        return None

    def _read(self, key: bytes) -> tuple[bytes, Meta] | None:
        name = entry_name(key)
        slot = self._slot(bytes.fromhex(name))
        if slot is None:
            return None
        return self.read_named(name, slot)

    def read_named(self, name: str, slot: tuple[int, int] | None = None) -> tuple[bytes, Meta] | None:
        """The verified (payload, meta) of the entry named ``name``; None (warned once) if it fails."""
        problem, found = self.check_named(name, slot)
        if problem is not None:
            damaged = problem.startswith("entry")
            self.warn_once(
                "damaged" if damaged else "read",
                f"{problem}; a miss (`kernelcache bundle verify {self.path}` lists every such entry)",
                counted_as="corrupt" if damaged else "read",
            )
        return found

    def check_named(
        self, name: str, slot: tuple[int, int] | None = None
    ) -> tuple[str | None, tuple[bytes, Meta] | None]:
        """(None, (payload, meta)) for the entry ``name`` that passes its check, else (why not, None).

        An absent name is (None, None). Nothing is warned or counted (for ``bundle verify``)."""
        if slot is None:
            slot = self._slot(bytes.fromhex(name))
            if slot is None:
                return None, None
        offset, length = slot
        if not self._inside_records(offset, length):
            where = f"entry {name[:16]} of the bundle {self.path}"
            return f"{where} is damaged (its index points outside the records)", None
        try:
            raw = _pread_all(self._fd, length, offset)
        except OSError as exc:
            return f"cannot read the bundle {self.path}: {exc}", None
        verdict, found = rec.decode(name, raw, self._secret)
        if verdict is not rec.Verdict.OK:
            return f"entry {name[:16]} of the bundle {self.path} is {verdict.value}", None
        return None, found

    def _inside_records(self, offset: int, length: int) -> bool:
        # Records lie between the header and the index: a slot pointing elsewhere (or declaring
        # a length larger than the file) is damage, found before anything is read or allocated.
        return fmt.HEADER.size <= offset and length <= self._header.index_offset - offset

    def names(self) -> Iterator[str]:
        """Every entry's name, in index order."""
        size = fmt.SLOT.size
        for at in range(0, len(self._index), size):
            yield self._index[at : at + 32].hex()

    def heads(self) -> Iterator[tuple[str, int, dict[str, Any] | None]]:
        """(name, record length, unverified head: size, created, meta) of every entry, for listings."""
        for at in range(0, len(self._index), fmt.SLOT.size):
            binary, offset, length = fmt.SLOT.unpack_from(self._index, at)
            if not self._inside_records(offset, length):
                yield binary.hex(), length, None
                continue
            try:
                prefix = os.pread(self._fd, rec.HEAD_SIZE, offset)
                end = rec.head_end(prefix)
                head = rec.peek_head(_pread_all(self._fd, min(end, length), offset)) if end else None
            except OSError:
                head = None
            yield binary.hex(), length, head

    def damaged(self) -> dict[str, str]:
        """Every entry that is not served (name -> why): what ``bundle verify`` reports."""
        out = {}
        for name in self.names():
            problem, found = self.check_named(name)
            if problem is None and found is None:  # listed, yet the look-up's binary search misses it
                problem = "not found by a look-up: the index is out of order (a miss every time)"
            if problem is not None:
                out[name] = problem
        return out

    @property
    def index_tag(self) -> bytes:
        """The bundle's index tag (its last 32 bytes): what an OCI manifest of it names."""
        return _pread_all(self._fd, fmt.TAG_SIZE, self._header.index_offset + self._header.index_length)

    # -- the mapping API: read-only ------------------------------------------------------

    def _refuse(self, what: str) -> PermissionError:
        return PermissionError(f"BundleProgramCache is read-only ({self.path}): it does not {what}")

    def set_record(
        self, key: bytes | str, payload: ValueLike, meta: Meta | None = None, *, internal: bool = False
    ) -> bool:
        raise self._refuse("store entries; write to a writable cache and build a new bundle")

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        raise self._refuse("store entries")

    def _remove(self, key: bytes) -> bool:
        raise self._refuse("remove entries")

    def clear(self) -> None:
        raise self._refuse("clear")

    def __len__(self) -> int:
        return self._header.count

    @property
    def read_only(self) -> bool:
        return True

    @property
    def signed(self) -> bool:
        return self._header.signed

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["entries"] = self._header.count
        out["read_only"] = 1
        return out

    def close(self) -> None:
        # Race: a thread still reading may pread the number after it is closed (EBADF: a
        # miss) or reused by another open; what it reads then fails the record's check
        # (the tag covers the entry's name): a miss, never another file's bytes served.
        with self._close_lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` (one pread in the usual case); short at the end of the file."""
    if fd < 0:
        raise ValueError("the BundleProgramCache is closed")
    data = os.pread(fd, length, offset)
    if len(data) == length or not data:
        return data
    parts = [data]
    got = len(data)
    while got < length:  # one pread returns at most about 2 GiB
        more = os.pread(fd, length - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _writable_by_others(st: os.stat_result, directory: bool) -> str | None:
    """Why someone other than you or root could change what this file (or directory) holds."""
    me = os.getuid() if hasattr(os, "getuid") else None
    if me is not None and st.st_uid not in (me, 0):
        return f"is owned by uid {st.st_uid} (neither you, uid {me}, nor root)"
    mode = st.st_mode
    if directory and mode & stat.S_ISVTX:
        return None  # sticky (/tmp): others may add files there, not rename over ours
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.filemode(mode)})"
    return None
