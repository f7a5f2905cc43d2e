"""Materialized copies: stored bytes handed out as files, for tools that want a path.

Triton's cache interface returns file paths (it reads the cubin and imports the launcher
``.so`` from them), so an entry read from kernelcache's store is copied to a file under
the cache's own root::

    <root>/materialized/<namespace>/<sha256 prefix>-<file name>           shared copies
    <root>/materialized/<namespace>/<owner>/<sha256 prefix>-<file name>   one owner's copies
    <root>/materialized/tmp/                       staging for atomic writes
    <root>/materialized/scratch/<process>/...      one process's copies (removed at its exit)

A copy of an entry of the store's file tier is a hard link to the entry file where the
filesystem allows (no second copy of the bytes, no new inode). One budget: a copy with bytes of
its own counts under the store's size cap like an entry (FileStreamProgramCache.count_copy), and
the store's eviction takes entries and copies in one LRU order (stores/file/lru.py). Copies idle
for KEEP_RECENT_S go as copies are written (``sweep``); ``kernelcache clear`` removes them all,
``prune`` those not handed out recently. Under a private root (``private_root``: the store has
no file tier, its directory was refused) the copies have the configured cap to themselves,
taken in the same order; never under a refused root. Every copy is read back and compared
after it is placed, before its path is handed out. In a team cache (a setgid root) copies are
group-readable and -writable, so members share them. Each copy is named by a digest of its
content, so the bytes at a path never change once written: a reader that got a path never
finds another writer's version there (Triton's own file manager overwrites in place, so a
group read while a peer rewrites it can mix versions).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import re
import stat
import threading
import time
import uuid
from typing import TYPE_CHECKING

from kernelcache import forksafe
from kernelcache.regular_file import holds_sha256_prefix
from kernelcache.regular_file import open_regular as open_regular_file
from kernelcache.stores.file import lru
from kernelcache.stores.file.marker import COPIES_DIR
from kernelcache.stores.file.ops import TMP_SUFFIX, freed, make_dirs, open_regular, stage

if TYPE_CHECKING:
    from kernelcache.stores.file.store import FileStreamProgramCache

MATERIALIZED_DIR = COPIES_DIR
# A copy handed out less than this long ago is kept by prune: the process that got its path
# reads it right away (Triton reads the whole group in CompiledKernel.__init__), so after
# this long nobody is about to read it. The same margin as the store's stale temp files.
KEEP_RECENT_S = 15 * 60
_ATTEMPTS = 5  # tries to place a copy while a concurrent prune removes empty directories


def check_file_name(name: str) -> str:
    """Return ``name`` if it is a plain file name; ValueError otherwise (no path may escape)."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\x00" in name
        or (os.altsep and os.altsep in name)
    ):
        raise ValueError(f"file name {name!r} must be a plain name without directories")
    return name


def materialize(
    root: str,
    namespace: str,
    owner: str | None,
    name: str,
    data: bytes,
    *,
    link_from: str | None = None,
    budget: FileStreamProgramCache | None = None,
    cap: int | None = None,
) -> str:
    """Return the path of a file under ``root`` holding exactly ``data``, named ``name``.

    Writes it (staged, then os.replace) unless an identical copy is already there; an
    existing copy has its mtime bumped, which tells prune it was just handed out. The copy
    is read back after it is placed: a path is handed out only for the right bytes.
    ``link_from``: a file (a store entry) expected to hold ``data``: the copy is a hard link
    to it where that works (no second copy of the bytes, no new inode). ``owner``: the
    folder of one owner's copies under ``namespace`` (a process's scratch copies, removed
    with it); None: the copy goes in ``namespace`` itself, shared by every owner (one
    directory for them all: none per owner). ``budget``: the store whose file tier ``root`` is:
    a copy with bytes of its own is counted under its cap (room made first). Without one (a
    private root), ``cap``: the bytes the copies may take, or DEFAULT_CAP (``sweep``).
    OSError when the directory cannot be written or the copy does not read back.
    """
    check_file_name(name)
    base = os.path.join(root, MATERIALIZED_DIR)
    digest = hashlib.sha256(data).hexdigest()[:32]
    folder = os.path.join(base, check_file_name(namespace), *([] if owner is None else [check_file_name(owner)]))
    # The content's digest leads the name (the extension, which Triton reads, stays last):
    # copies of one name with other bytes never share a path, and no copy needs a directory.
    path = os.path.join(folder, f"{digest}-{name}")
    if _reuse(path, data):
        return path
    tmp, own = _staged(root, os.path.join(base, "tmp"), data, link_from, budget)
    try:
        replaced = _place(tmp, folder, path, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if budget is not None and own:
            budget.copies_freed(own)
        raise
    if budget is not None and replaced:
        budget.copies_freed(replaced)
    with contextlib.suppress(OSError):
        # Staging's directory goes once empty. Race: a peer staging has its file there (rmdir fails) or makes it again.
        os.rmdir(os.path.join(base, "tmp"))
    _after_write(root, len(data), budget, cap)
    return path


def _reuse(path: str, data: bytes) -> bool:
    """True when ``path`` already holds ``data``; its mtime is bumped so prune keeps it."""
    if not same_content(path, data):
        return False
    try:
        # Race with prune: it may unlink between our compare and this utime (prune
        # only takes copies idle for KEEP_RECENT_S, so that needs a copy idle that long
        # and then handed out in the same microseconds). Triton then fails to open the
        # path; a rerun rematerializes it. Never a wrong file, since paths are immutable.
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except PermissionError:
        # Another team member's copy that we may read but not mark (their umask left it
        # without group write, as a copy linked to their entry keeps the entry's mode):
        # unmarked, prune could take it while Triton opens it; we place a copy of our own.
        return False


def _place(tmp: str, folder: str, path: str, data: bytes) -> int:
    """Move the staged file ``tmp`` to ``path`` (in ``folder``) and check it reads back; the
    bytes of its own the file it replaced gave back (a copy of the same content: a peer's)."""
    tries = 0
    while True:
        try:
            make_dirs(folder)
            try:
                replaced = freed(os.lstat(path))
            except FileNotFoundError:
                replaced = 0
            # Two processes materializing the same bytes both replace: either result is
            # the same content, and a reader holding the path sees one whole file or the other.
            os.replace(tmp, path)
            # Race: whoever can write the folder could swap the file between our replace
            # and Triton's open. Copies live only under an accepted or private root, where
            # nobody else can; reading it back catches anything that got there anyway.
            if not same_content(path, data):
                raise OSError(f"the copy at {path} does not hold the bytes just placed there")
            return replaced
        except FileNotFoundError:
            # Race with prune: it keeps recent files but removes every empty directory,
            # so the folder just made (or a parent) can vanish before the replace lands
            # in it. Make it again; only a clear that also took our staged file fails.
            tries += 1
            if tries == _ATTEMPTS:
                raise


def _staged(
    root: str, tmp_dir: str, data: bytes, link_from: str | None, budget: FileStreamProgramCache | None
) -> tuple[str, int]:
    """(a new file in tmp_dir holding ``data``, the bytes of its own counted under ``budget``):
    a hard link to ``link_from`` when it holds exactly that (an entry is replaced, never
    rewritten in place, so its inode's bytes never change: 0 bytes of its own), else a written
    copy, counted first (the store makes room before the bytes land)."""
    # Each new directory gets its parent's mode, less others' write: 0700 under a private
    # cache, group-writable and setgid under a team cache (every member materializes there).
    make_dirs(tmp_dir)
    if link_from is not None:
        tmp = os.path.join(tmp_dir, f"{uuid.uuid4().hex}{TMP_SUFFIX}")
        try:
            os.link(link_from, tmp, follow_symlinks=False)
        except OSError:
            pass  # another filesystem, no such entry (evicted, Redis-only), links refused
        else:
            # Race: the entry may have been replaced by other bytes since they were read.
            if same_content(tmp, data):
                return tmp, 0
            os.unlink(tmp)
    # A team cache's root is setgid: its members share each other's copies (0600 would make
    # a member who cannot read a copy replace it, and the other then fail to read its own).
    # Group-writable too, as the team's entries are: a member marks a copy it is handed out
    # (utime needs write permission on another member's file).
    team = bool(os.stat(root).st_mode & stat.S_ISGID)
    if budget is not None:
        budget.count_copy(len(data))
    try:
        tmp = stage(tmp_dir, data, durable=False, mode=0o660 if team else 0o600)  # O_EXCL: no planted link
        if team:
            os.chmod(tmp, 0o660)  # whatever the umask
    except BaseException:
        if budget is not None:
            budget.copies_freed(len(data))
        raise
    return tmp, len(data)


def same_content(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file holding exactly ``data`` (never waits on a FIFO)."""
    try:
        # Only a regular file, opened without waiting: a FIFO planted at a copy's path (by
        # whoever can write a team cache's folders) would block a plain open forever.
        fd, st = open_regular(path)
    except OSError:
        return False
    try:
        if st.st_size != len(data):
            return False
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks) == data
    except OSError:
        return False
    finally:
        os.close(fd)


def remove_materialized(root: str, idle_s: float | None = None) -> tuple[int, int]:
    """Remove copies under ``root`` not handed out for ``idle_s`` seconds (None: all).

    Returns (files removed, bytes given back: ops.freed, a copy linked to an entry frees none).
    Only files this module wrote go: a copy whose
    content still hashes to its folder's name, or a staged file of ours in tmp/; anything
    else under ``materialized/`` (a user's file in a directory mistaken for a cache) stays.
    Empty directories go too.
    """
    base = os.path.join(root, MATERIALIZED_DIR)
    cutoff = None if idle_s is None else time.time() - idle_s
    files = given = 0
    for dirpath, dirnames, filenames in os.walk(base, topdown=False):
        for fname in filenames:
            path = os.path.join(dirpath, fname)
            try:
                st = os.lstat(path)
                if (cutoff is not None and st.st_mtime >= cutoff) or not _is_ours(base, path):
                    continue
                # Race: a copy handed out while _is_ours read it has a new mtime: it stays
                # (as in sweep; the moment between this lstat and the unlink remains).
                if cutoff is not None and os.lstat(path).st_mtime != st.st_mtime:
                    continue
                os.unlink(path)
            except OSError:
                continue
            files += 1
            given += freed(st)
        for dname in dirnames:
            try:
                os.rmdir(os.path.join(dirpath, dname))  # only if empty
            except OSError:
                pass
    return files, given


_DIGEST = re.compile(r"[0-9a-f]{32}")
_STAGED = re.compile(r"[0-9a-f]{32}\.tmp")
_NAMED = re.compile(r"[0-9a-f]{32}-.+")


def _is_ours(base: str, path: str) -> bool:
    """Whether path (under base) is a copy materialize wrote, or one of its staged files."""
    parts = os.path.relpath(path, base).split(os.sep)
    if parts == [_STAMP]:
        return True
    if len(parts) == 2 and parts[0] == "tmp":
        return bool(_STAGED.fullmatch(parts[1]))
    if len(parts) in (2, 3) and parts[0] != "tmp" and _NAMED.fullmatch(parts[-1]):
        expected = parts[-1][:32]  # <ns>/<digest>-<name> or <ns>/<owner>/<digest>-<name>
    elif len(parts) == 4 and _DIGEST.fullmatch(parts[2]):
        expected = parts[2]  # the earlier layout: <ns>/<owner>/<digest>/<name>
    else:
        return False
    return holds_sha256_prefix(path, expected)


# -- keeping copies bounded without a manual prune ------------------------------------------

DEFAULT_CAP = 1 << 30  # copies' own cap under a private root (no store: no cap of a store's)
SWEEP_EVERY_S = 60.0  # at most this long between sweeps while a process hands out copies
MIN_AGE_S = lru.COPY_MIN_AGE_S  # a copy younger than this is never taken for room: Triton is about to open it
_STAMP = ".swept"  # under a private root, its mtime: the last sweep of that root (any process)


class _Pending:
    """Bytes of copies written since this process's last sweep (a sweep is due at an eighth of the cap)."""

    def __init__(self) -> None:
        self.bytes = 0
        self.lock = threading.Lock()

    def after_fork_in_child(self) -> None:
        """A fresh lock (a thread of the parent may have held it), nothing written yet."""
        self.bytes = 0
        self.lock = threading.Lock()


_pending = _Pending()
forksafe.reset_in_child(_pending)


def _after_write(root: str, written: int, budget: FileStreamProgramCache | None, cap: int | None) -> None:
    """Sweep once enough new bytes were written since the last sweep (an eighth of the cap),
    or the last sweep of this root is older than SWEEP_EVERY_S."""
    if budget is not None:
        cap = budget.max_size_bytes
    cap = DEFAULT_CAP if cap is None else cap
    with _pending.lock:
        _pending.bytes += written
        due = _pending.bytes * 8 >= cap
    if budget is not None:
        # The store's counters keep when copies were last swept (no stamp file): idle ones go;
        # room for the cap is the store's eviction, copies and entries alike.
        if due or time.time() - budget.copies_swept_at() >= SWEEP_EVERY_S:
            with _pending.lock:
                _pending.bytes = 0
            budget.copies_swept_at(time.time())
            budget.copies_freed(remove_materialized(root, KEEP_RECENT_S)[1])
        return
    stamp = os.path.join(root, MATERIALIZED_DIR, _STAMP)
    if not due:
        try:
            due = time.time() - os.stat(stamp).st_mtime >= SWEEP_EVERY_S
        except FileNotFoundError:
            due = True
        except OSError:
            return
    if due:
        with _pending.lock:
            _pending.bytes = 0
        with contextlib.suppress(OSError):
            # Never a plain open: a FIFO planted there (whoever can write a team cache's
            # folders can) blocks it forever; a symlink would touch or create its target.
            fd, _ = open_regular_file(stamp, os.O_WRONLY | os.O_CREAT, mode=0o666)
            try:
                os.utime(fd)
            finally:
                os.close(fd)
        sweep(root, cap)


def sweep(root: str, cap: int) -> tuple[int, int]:
    """Under a private root (no store): remove copies idle for KEEP_RECENT_S, then the least
    recently handed out until their bytes fit ``cap`` (lru.take: the order and the age rule of
    the store's own eviction; never one younger than MIN_AGE_S). Returns (files removed, bytes freed)."""
    files, given = remove_materialized(root, KEEP_RECENT_S)
    copies, total = lru.scan_copies(root)
    copies.sort(key=lambda c: (c.last_used_ns, c.path))
    taken: list[int] = []

    def remove(c: lru.Candidate) -> int | None:
        got = lru.remove_copy(c)
        if got is not None:
            taken.append(got)
        return got

    lru.take(collections.deque(copies), total, cap, remove)
    return files + len(taken), given + sum(taken)


def remove_owner(root: str, owner: str) -> int:
    """Remove one owner's scratch copies (a process's, at its exit); the bytes given back."""
    folder = os.path.join(root, MATERIALIZED_DIR, "scratch", check_file_name(owner))
    given = 0
    for dirpath, _, filenames in os.walk(folder, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                os.unlink(path)
                given += freed(st)
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(folder))  # scratch/ itself, once no process has copies there
    return given
