"""Materialized copies: stored bytes handed out as files, for tools that want a path.

Triton's cache interface returns file paths (it reads the cubin and imports the launcher
``.so`` from them), so an entry read from kernelcache's store is copied to a file under
the cache's own root::

    <root>/materialized/<namespace>/<sha256 prefix>-<file name>           shared copies
    <root>/materialized/<namespace>/<owner>/<sha256 prefix>-<file name>   one owner's copies
    <root>/materialized/tmp/                       staging for atomic writes
    <root>/materialized/scratch/<process>/...      one process's copies (removed at its exit)

A copy of an entry of the store's file tier is a hard link to the entry file where the
filesystem allows (no second copy of the bytes, no new inode); the copies' own bytes are
bounded by the store's size cap (``sweep``, run as copies are written: idle ones go without
a manual ``prune``).

Copies go only under a root the store accepted (its file tier's), or, when the store has no
file tier (the disk tier was refused: another user's or an other-writable directory), under
a private per-user directory (``private_root``), never under a refused one. Every copy is
read back and compared after it is placed, before its path is handed out. In a team cache
(a setgid root) copies are group-readable and -writable, so members share them instead of
replacing each other's. The copies are not entries: the store's size tracker never sees
them, ``kernelcache clear`` removes them all and ``kernelcache prune`` removes those not
handed out recently. Each copy is named by a digest of its content, so the bytes at a path
never change once written: a reader that got a path and reads it later can never find
another writer's version there (Triton's own file manager overwrites in place, so a group
read while a peer rewrites it can mix versions).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
import threading
import time
import uuid

from kernelcache.regular_file import open_regular as open_regular_file
from kernelcache.stores.file.ops import TMP_SUFFIX, make_dirs, open_regular, stage

MATERIALIZED_DIR = "materialized"
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


def private_root() -> str:
    """This user's own directory for copies: ``$XDG_RUNTIME_DIR/kernelcache`` (a directory
    only its user can enter) or ``<temp dir>/kernelcache-<uid>``, created 0700.

    OSError when the path exists and is not a directory this user owns that nobody else can
    write or enter (a planted symlink, another user's directory): no copy goes there.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        path = os.path.join(runtime, "kernelcache")
    else:
        path = os.path.join(tempfile.gettempdir(), f"kernelcache-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)  # never follows a link: a planted one is refused, not entered
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} is not a private directory of uid {os.geteuid()}; no copies are written there")
    return path


def materialize(
    root: str,
    namespace: str,
    owner: str | None,
    name: str,
    data: bytes,
    *,
    link_from: str | None = None,
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
    directory for them all: none per owner). ``cap``: the bytes copies may take (``sweep``).
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
    tmp = _staged(root, os.path.join(base, "tmp"), data, link_from)
    try:
        _place(tmp, folder, path, data)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # A linked copy counts too: it takes bytes of its own once the store evicts its entry.
    _after_write(root, len(data), cap)
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


def _place(tmp: str, folder: str, path: str, data: bytes) -> None:
    """Move the staged file ``tmp`` to ``path`` (in ``folder``) and check it reads back."""
    tries = 0
    while True:
        try:
            make_dirs(folder)
            # Two processes materializing the same bytes both replace: either result is
            # the same content, and a reader holding the path sees one whole file or the other.
            os.replace(tmp, path)
            # Race: whoever can write the folder could swap the file between our replace
            # and Triton's open. Copies live only under an accepted or private root, where
            # nobody else can; reading it back catches anything that got there anyway.
            if not same_content(path, data):
                raise OSError(f"the copy at {path} does not hold the bytes just placed there")
            return
        except FileNotFoundError:
            # Race with prune: it keeps recent files but removes every empty directory,
            # so the folder just made (or a parent) can vanish before the replace lands
            # in it. Make it again; only a clear that also took our staged file fails.
            tries += 1
            if tries == _ATTEMPTS:
                raise


def _staged(root: str, tmp_dir: str, data: bytes, link_from: str | None) -> str:
    """A new file in tmp_dir holding ``data``: a hard link to ``link_from`` when it holds
    exactly that (an entry is replaced, never rewritten in place, so its inode's bytes never
    change), else a written copy."""
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
                return tmp
            os.unlink(tmp)
    # A team cache's root is setgid: its members share each other's copies (0600 would make
    # a member who cannot read a copy replace it, and the other then fail to read its own).
    # Group-writable too, as the team's entries are: a member marks a copy it is handed out
    # (utime needs write permission on another member's file).
    team = bool(os.stat(root).st_mode & stat.S_ISGID)
    tmp = stage(tmp_dir, data, durable=False, mode=0o660 if team else 0o600)  # O_EXCL: no planted link
    if team:
        os.chmod(tmp, 0o660)  # whatever the umask
    return tmp


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

    Returns (files removed, bytes freed). Only files this module wrote go: a copy whose
    content still hashes to its folder's name, or a staged file of ours in tmp/; anything
    else under ``materialized/`` (a user's file in a directory mistaken for a cache) stays.
    Empty directories go too.
    """
    base = os.path.join(root, MATERIALIZED_DIR)
    cutoff = None if idle_s is None else time.time() - idle_s
    files = freed = 0
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
            freed += st.st_size
        for dname in dirnames:
            try:
                os.rmdir(os.path.join(dirpath, dname))  # only if empty
            except OSError:
                pass
    return files, freed


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
    try:
        fd, _ = open_regular(path)
    except OSError:
        return False
    try:
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    except OSError:
        return False
    finally:
        os.close(fd)
    return digest.hexdigest()[:32] == expected


# -- keeping copies bounded without a manual prune ------------------------------------------

DEFAULT_CAP = 1 << 30  # copies' own cap where the store has none
SWEEP_EVERY_S = 60.0  # at most this long between sweeps while a process hands out copies
MIN_AGE_S = 5.0  # a copy younger than this is never taken for the cap: Triton is about to open it
_STAMP = ".swept"  # its mtime: the last sweep of this root (any process)
_pending = {"bytes": 0}
_pending_lock = threading.Lock()
os.register_at_fork(after_in_child=lambda: _pending.update(bytes=0))


def _after_write(root: str, written: int, cap: int | None) -> None:
    """Sweep once enough new bytes were written since the last sweep (an eighth of the cap),
    or the last sweep of this root is older than SWEEP_EVERY_S."""
    cap = DEFAULT_CAP if cap is None else cap
    with _pending_lock:
        _pending["bytes"] += written
        due = _pending["bytes"] * 8 >= cap
    stamp = os.path.join(root, MATERIALIZED_DIR, _STAMP)
    if not due:
        try:
            due = time.time() - os.stat(stamp).st_mtime >= SWEEP_EVERY_S
        except FileNotFoundError:
            due = True
        except OSError:
            return
    if due:
        with _pending_lock:
            _pending["bytes"] = 0
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
    """Remove copies idle for KEEP_RECENT_S, then the least recently handed out until the
    copies' own bytes fit ``cap`` (never one younger than MIN_AGE_S). A copy that is a hard
    link to an entry costs no bytes of its own (the entry's are counted in the store's cap)
    until the entry goes. Returns (files removed, bytes freed)."""
    files, freed = remove_materialized(root, KEEP_RECENT_S)
    base = os.path.join(root, MATERIALIZED_DIR)
    copies = []
    for dirpath, _, filenames in os.walk(base):
        for fname in filenames:
            path = os.path.join(dirpath, fname)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_nlink == 1 and _is_ours(base, path):
                copies.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in copies)
    young = time.time() - MIN_AGE_S
    # Race: another process may hand out a copy after our scan saw it idle (the scan hashes
    # every copy: it can take seconds), bumping its mtime. So each copy's mtime is looked at
    # again just before it goes, and a copy handed out meanwhile stays. What remains is the
    # moment between that look and the unlink; a path whose file is gone then makes Triton
    # recompile or fail to open it, never load other bytes (paths are immutable).
    for mtime, size, path in sorted(copies):
        if total <= cap or mtime >= young:
            break
        with contextlib.suppress(OSError):
            if os.lstat(path).st_mtime != mtime:
                continue  # handed out since the scan
            os.unlink(path)
            total -= size
            files += 1
            freed += size
    return files, freed
