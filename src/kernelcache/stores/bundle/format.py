"""The bundle file: many records in one file, with a sorted index, written atomically.

::

    header (64 bytes)  b"KCBUNDLE" | u32 format | u32 flags | key id (8) | u64 count
                       | u64 index offset | u64 index length | 16 zero bytes
    records            one record (stores/record.py) per entry, back to back
    index              count x (entry name, 32 bytes | u64 offset | u64 length), sorted by name
    index tag          32 bytes: SHA-256 (unsigned) or HMAC-SHA256 (signed) of header + index

Each record is checked on its own, under its entry's name (naming.entry_name: the name an
entry has on disk and in Redis), so an index that points one name at another's record
finds a record that fails its check: a miss, never someone else's kernel. The index tag
lets a reader (and ``bundle verify``) tell a damaged or truncated index from a good one.
A look-up is one binary search in the index (read once, at open) and one ``pread``.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import struct
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kernelcache.regular_file import NotRegularFileError, open_regular
from kernelcache.stores import record as rec

MAGIC = b"KCBUNDLE"
FORMAT = 1
SIGNED = 1
HEADER = struct.Struct("<8sII8sQQQ16x")
SLOT = struct.Struct("<32sQQ")  # entry name (binary), record offset, record length
TAG_SIZE = 32
_INDEX_DOMAIN = b"kernelcache bundle index\0"
# An index larger than this is not one of ours: a reader holds the index in memory.
MAX_INDEX_BYTES = 1 << 31


class InvalidBundleError(ValueError):
    """The file is not a bundle this version can read, or its header or index is damaged."""


@dataclass(frozen=True)
class Header:
    """What a bundle's first 64 bytes say."""

    signed: bool
    key_id: bytes
    count: int
    index_offset: int
    index_length: int


def index_tag(secret: bytes | None, header: bytes, index: bytes | memoryview) -> bytes:
    """The tag over a bundle's header and index (HMAC with ``secret``, else SHA-256)."""
    h: Any = hashlib.sha256() if secret is None else hmac.new(secret, digestmod=hashlib.sha256)
    h.update(_INDEX_DOMAIN)
    h.update(header)
    h.update(index)
    return h.digest()


def parse_header(raw: bytes, path: str, file_size: int) -> Header:
    """The header of the bundle at ``path``; InvalidBundleError naming what is wrong."""
    if len(raw) < HEADER.size or raw[:8] != MAGIC:
        raise InvalidBundleError(f"{path} is not a kernelcache bundle (no bundle header)")
    _, fmt, flags, kid, count, offset, length = HEADER.unpack_from(raw)
    if fmt != FORMAT or flags & ~SIGNED:
        raise InvalidBundleError(
            f"{path} is a bundle of format {fmt} (flags {flags}), which this version of kernelcache does "
            f"not read (it reads format {FORMAT}): rebuild it with `kernelcache bundle create`"
        )
    if length != count * SLOT.size or length > MAX_INDEX_BYTES or offset + length + TAG_SIZE != file_size:
        raise InvalidBundleError(f"{path} is damaged or truncated (its index does not fit the file)")
    return Header(bool(flags & SIGNED), kid, count, offset, length)


@dataclass
class BundleSummary:
    """What ``write_bundle`` wrote."""

    path: str
    entries: int
    bytes: int
    signed: bool


def write_bundle(
    path: str | os.PathLike[str],
    records: Iterable[tuple[str, bytes, dict[str, Any], float | None]],
    secret: bytes | None = None,
) -> BundleSummary:
    """Write ``records`` ((entry name, payload, meta, created)) as a bundle at ``path``.

    Staged in the target's directory, fsynced, then renamed over ``path``: a reader (or a
    crash) sees the old file or the new one, never a part. The first record of a name wins.
    Records are written as they come, one at a time (a cache larger than memory is fine);
    given in name order, the same entries give the same bytes. The file is created 0644
    less the umask (a bundle is meant to be read by other users). Only an older bundle is
    replaced: anything else at ``path`` (a file of the user's, a symlink, a FIFO) is
    FileExistsError, and nothing is written.
    """
    target = os.path.abspath(os.fspath(path))
    refuse_other_file(target)
    directory = os.path.dirname(target)
    staged = os.path.join(directory, f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    kid = rec.key_id(secret)
    flags = SIGNED if secret is not None else 0
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        slots: dict[bytes, bytes] = {}
        offset = HEADER.size
        os.pwrite(fd, bytes(HEADER.size), 0)  # the header is written last, once the index is known
        for name, payload, meta, created in records:
            binary = bytes.fromhex(name)
            if len(binary) != 32 or binary in slots:
                continue  # not an entry name, or a name already written
            raw = rec.encode(name, payload, meta, secret, created=created)
            _write_all(fd, raw, offset)
            slots[binary] = SLOT.pack(binary, offset, len(raw))
            offset += len(raw)
        index = b"".join(slots[n] for n in sorted(slots))
        header = HEADER.pack(MAGIC, FORMAT, flags, kid, len(slots), offset, len(index))
        _write_all(fd, index + index_tag(secret, header, index), offset)
        _write_all(fd, header, 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(staged)
        raise
    os.close(fd)
    try:
        os.replace(staged, target)
    except BaseException:
        os.unlink(staged)
        raise
    _fsync_dir(directory)
    return BundleSummary(target, len(slots), offset + len(index) + TAG_SIZE, secret is not None)


def refuse_other_file(target: str) -> None:
    """FileExistsError when something other than a bundle is at ``target``.

    Race: a file put there between this check and the rename is replaced; the check is for
    the mistyped path (``bundle create notes.txt``), not for a writer racing the command.
    """
    try:
        fd, st = open_regular(target)  # a symlink is not a bundle; a FIFO is refused, not waited on
    except FileNotFoundError:
        return
    except NotRegularFileError as exc:
        why = "a symlink" if exc.errno == errno.ELOOP else "not a regular file"
    except OSError as exc:
        why = exc.strerror or str(exc)
    else:
        try:  # an empty file (mktemp's) holds nothing to lose
            why = "" if not st.st_size or os.pread(fd, len(MAGIC), 0) == MAGIC else "no bundle header"
        finally:
            os.close(fd)
        if not why:
            return
    raise FileExistsError(
        f"{target} exists and is not a kernelcache bundle ({why}): only an older bundle is replaced; "
        "remove it or choose another path"
    )


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _fsync_dir(directory: str) -> None:
    # The rename is durable only once the directory is: a crash right after must not leave
    # the old file (or none) where the caller was told the bundle is.
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
