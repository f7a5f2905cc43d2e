"""Change notification for what a process already proved about its headers (Linux inotify).

A look-up proves each header's content and each probe's resolution with a stat per header and
per directory searched (headers.index). A process that looks the same kernels up again, or
many kernels sharing one include tree, would prove the same facts again and again. Instead,
before it proves a fact about a path, it asks the kernel to report any change to that path:
the file itself (written, truncated, chmod'ed, renamed, deleted: its inode, so a write through
a hard link elsewhere counts too), a searched directory (an entry created, removed, renamed),
and every directory on the way to it (an entry named like the next component created, removed
or renamed: a renamed parent or a repointed symlink changes what the path names). A fact
proved after those watches were in place, with no relevant event since, still holds: the
look-up trusts it without a stat. Any relevant event makes every fact of this process
unproved again (they are proved again by stat, and watched again); so does a lost event
(the queue overflowed).

Used only where the kernel reports every change: local filesystems (ext2/3/4, XFS, Btrfs,
tmpfs, overlayfs, ZFS, F2FS), by the filesystem type of each device. Network and FUSE
filesystems (another host's change raises no event here) are proved by stat every time.
Hazards, named: a write through a shared mmap raises no inotify event, and neither does a
filesystem mounted over a watched path; either can make a header change unseen by a process
until it restarts (a fresh process proves everything by stat). A forked child drops the
parent's watches and facts (the inotify queue is shared with the parent after fork).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from typing import Any

from kernelcache import forksafe
from kernelcache.headers import index as index_mod
from kernelcache.memo import remember

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF = 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x2000, 0x4000, 0x8000
IN_MASK_ADD = 0x20000000
_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC

_SELF = IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT | IN_IGNORED | IN_Q_OVERFLOW
FILE_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF
ENTRY_MASK = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF
DIR_MASK = ENTRY_MASK | IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE

# statfs f_type of the filesystems whose every change raises an event here.
LOCAL_FILESYSTEMS = frozenset(
    {
        0xEF53,  # ext2/3/4
        0x58465342,  # XFS
        0x9123683E,  # Btrfs
        0x01021994,  # tmpfs
        0x794C7630,  # overlayfs
        0x2FC12FC1,  # ZFS
        0xF2F52010,  # F2FS
        0x858458F6,  # ramfs
    }
)


class Watcher:
    """One inotify instance of this process; ``generation`` moves on every relevant event."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self._libc = libc
        self._lock = threading.Lock()
        self.generation = 0
        self._names: dict[int, set[str] | None] = {}  # wd -> the entry names that matter (None: all)
        self._guarded: set[tuple[str, bool]] = set()
        self._watched: set[tuple[str, str]] = set()  # (directory, entry name) watched on the way
        self._entry_wd: dict[str, int] = {}  # directory -> its watch (the entries on the way to a path)
        self._local: dict[int, bool] = {}  # st_dev -> on a filesystem that reports every change
        self.max_watches = _max_watches()  # beyond it, what a look-up proves is proved by stat again

    def changed(self) -> int:
        """The generation after reading every event queued so far."""
        with self._lock:
            while True:
                try:
                    data = os.read(self.fd, 65536)
                except BlockingIOError:
                    return self.generation
                except OSError:
                    self.generation += 1  # cannot read: nothing proved stays proved
                    return self.generation
                self._take(data)

    def _take(self, data: bytes) -> None:
        pos, relevant = 0, False
        while pos + 16 <= len(data):
            wd, mask, _cookie, size = struct.unpack_from("iIII", data, pos)
            name = data[pos + 16 : pos + 16 + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
            pos += 16 + size
            names = self._names.get(wd, None) if wd in self._names else None
            if mask & _SELF or names is None or name in names:
                relevant = True
        if relevant:
            self.generation += 1
            self._guarded.clear()  # a watch may be gone (IN_IGNORED): watch everything again
            self._watched.clear()
            self._entry_wd.clear()

    def guard(self, path: str, whole_dir: bool) -> bool:
        """Watch ``path`` (a file, or with ``whole_dir`` a directory's every entry) and each
        directory on the way to it; False when some watch cannot be added (then nothing about
        the path may be trusted without a stat). A path that does not exist is guarded by its
        nearest existing directory (the entry that would create it)."""
        with self._lock:
            if (path, whole_dir) in self._guarded:
                return True
            directory, name = _split(path)
            way = self._way(directory, name) if name else 0
            if way == -2:
                return True  # an ancestor is missing: the watch above reports its creation
            if way < 0:
                return False
            leaf = self._add(path, DIR_MASK if whole_dir else FILE_MASK, None)
            if leaf == -1:
                return False
            self._guarded.add((path, whole_dir))
            return True

    def _way(self, directory: str, name: str) -> int:
        """Watch ``directory`` for its entry ``name``, and each directory above it for the next
        component, from the top down (0; -2: one is missing; -1: one cannot be watched).

        Most headers share their directories: a directory watched once takes each further name
        into its filter without a call (its wd is known). Race: a directory replaced since its
        watch was added (renamed away, another made in its place) raised an event on the way to
        it or on itself; that event moves the generation, which clears these memos, and no
        look-up running across it commits (Look.commit)."""
        if (directory, name) in self._watched:
            return 0
        if not directory:
            return 0  # a relative path: its first component is not watched (the working directory)
        up, base = _split(directory)
        if base:
            way = self._way(up, base)
            if way != 0:
                return way
        wd = self._entry_wd.get(directory)
        if wd is None:
            wd = self._add(directory, ENTRY_MASK, {name})
            if wd < 0:
                return wd
            self._entry_wd[directory] = wd
        else:
            names = self._names.get(wd)
            if names is not None:
                names.add(name)
        self._watched.add((directory, name))
        return 0

    def _add(self, path: str, mask: int, names: set[str] | None) -> int:
        """The watch of ``path`` (-2: it does not exist; -1: cannot be watched)."""
        if len(self._names) >= self.max_watches:
            return -1  # this process's share of the user's watches is used up (see _max_watches)
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask | IN_MASK_ADD)
        if wd < 0:
            err = ctypes.get_errno()
            return -2 if err in (2, 20) else -1  # ENOENT, ENOTDIR
        known = self._names.get(wd, set())
        if names is None or known is None:
            self._names[wd] = None
        else:
            known.update(names)
            self._names[wd] = known
        return int(wd)

    def local(self, st_dev: int, path: str) -> bool:
        """Whether ``path``'s filesystem (device ``st_dev``) reports every change here."""
        known = self._local.get(st_dev)
        if known is None:
            buf = ctypes.create_string_buffer(256)
            ok = self._libc.statfs(os.fsencode(path), buf) == 0
            known = ok and struct.unpack_from("l", buf)[0] in LOCAL_FILESYSTEMS
            self._local[st_dev] = known
        return known


def _max_watches() -> int:
    """The watches one process may add: an eighth of the user's inotify limit, at most 16384.

    The limit (fs.inotify.max_user_watches: 8192 on older kernels) is shared by every process of
    the user, editors and build tools included: a fleet of processes each watching a deep include
    tree must not leave them none. Every look-up of a process watches what it proves, about a
    thousand watches for a CUB kernel's headers and directories."""
    try:
        with open("/proc/sys/fs/inotify/max_user_watches", "rb") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        limit = 8192
    return max(0, min(16384, limit // 8))


def _split(path: str) -> tuple[str, str]:
    """os.path.split for the normalised paths guarded here, by str.rpartition (a fresh process's
    look-up splits every header's path and each directory's on the way)."""
    head, sep, tail = path.rpartition(os.sep)
    if not sep:
        return "", path
    return head or os.sep, tail


_watcher: Watcher | None = None
_tried = False
_make_lock = threading.Lock()


def watcher() -> Watcher | None:
    """This process's watcher; None where inotify is not available (then everything is proved by stat)."""
    global _watcher, _tried
    if _tried:
        return _watcher
    with _make_lock:
        if not _tried:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = libc.inotify_init1(_NONBLOCK_CLOEXEC)
                _watcher = Watcher(fd, libc) if fd >= 0 else None
            except (OSError, AttributeError):
                _watcher = None
            _tried = True
    return _watcher


class Look:
    """One look-up's use of an index: the facts, plus what this process already proved under
    watch (headers.watch) and has seen no change to since. What this look-up proves under
    watch is trusted by later look-ups only if no relevant event arrived from before its
    first watch to its end (commit).

    ``watching``: whether to watch what it proves (the manifests' look-ups always do: see
    headers.manifests.matching_variant)."""

    def __init__(self, index: index_mod.HeaderIndex, watching: bool = True) -> None:
        self.index = index
        self.seen: dict[str, dict[str, str] | None] = {}  # this look-up's listings
        self.watcher = watcher()
        self.generation = self.watcher.changed() if self.watcher is not None else -1
        self.watching = watching and self.watcher is not None
        self._files: list[tuple[str, str]] = []
        self._proofs: list[str] = []
        self._variants: list[Any] = []
        self._unwatched = False  # something this look-up proved could not be watched

    def digest(self, path: str) -> str | None:
        w = self.watcher
        if w is not None:
            known = self.index.watched_files.get(path)
            if known is not None and known[1] == self.generation:
                return known[0]
        if w is None or not self.watching:
            self._unwatched = True
            return self.index.digest_stat(path)[0]
        guarded = w.guard(path, False)  # before the stat: a change after it is reported
        digest, st = self.index.digest_stat(path)
        if guarded and digest is not None and st is not None and w.local(st.st_dev, path):
            self._files.append((path, digest))
        else:
            self._unwatched = True
        return digest

    def variant_known(self, key: Any) -> bool:
        """Whether this variant matched under watch in this process, with no change since."""
        return self.watcher is not None and self.index.watched_variants.get(key) == self.generation

    def variant_held(self, key: Any) -> None:
        """The variant matched: trusted whole by later look-ups if all it rests on was watched."""
        if self.watcher is not None and not self._unwatched:
            self._variants.append(key)

    def is_file(self, path: str) -> tuple[bool, bool]:
        return self.index.is_file(path, self.seen)

    def probes_known(self, key: str) -> bool:
        """Whether these probes were proved under watch, with no change since."""
        return self.watcher is not None and self.index.watched_proofs.get(key) == self.generation

    def dir_state(self, directories: list[str]) -> tuple[list[Any], bool]:
        """index.dir_state, the directories watched first (their entries and the way to them)."""
        w = self.watcher if self.watching else None
        guarded = w is not None and all(w.guard(d, True) for d in directories)
        state, safe = self.index.dir_state(directories)
        self._guarded_state = (
            guarded and w is not None and all(s == 0 or w.local(s[0], d) for s, d in zip(state, directories))
        )
        return state, safe

    def proof_dirs(self, key: str) -> list[str] | None:
        return self.index.proof_dirs(key)

    def proved(self, key: str, state: list[Any]) -> bool:
        return self.index.proved(key, state)

    def proof_links(self, key: str) -> list[Any]:
        return self.index.proof_links(key)

    def holds(self, key: str, directories: list[str], state: list[Any], kept: bool, links: list[Any]) -> None:
        """The probes of ``key`` hold while ``directories`` are in ``state`` and each of
        ``links`` answers as it did (``kept``: also a proof for other processes). A proof with
        links is never trusted under watch: a symlink's target can change in a directory no
        watch covers, so each use asks its links again (index.proved)."""
        if kept:
            self.index.keep_proof(key, directories, state, links)
        if getattr(self, "_guarded_state", False) and not links:
            self._proofs.append(key)
        else:
            self._unwatched = True

    def commit(self) -> None:
        """Trust what this look-up proved under watch, if nothing changed meanwhile."""
        w = self.watcher
        if w is None or not (self._files or self._proofs or self._variants) or w.changed() != self.generation:
            return
        with self.index._lock:
            for path, digest in self._files:
                remember(self.index.watched_files, path, (digest, self.generation), index_mod.MAX_FILES)
            for key in self._proofs:
                remember(self.index.watched_proofs, key, self.generation, index_mod.MAX_PROOFS)
            for key in self._variants:
                remember(self.index.watched_variants, key, self.generation, index_mod.MAX_PROOFS)


def _drop_in_child() -> None:
    # The inotify queue is shared with the parent after fork: the child would take events
    # the parent needs and miss some of its own. It starts with no watches and no facts.
    global _watcher, _tried, _make_lock
    if _watcher is not None:
        try:
            os.close(_watcher.fd)
        except OSError:
            pass
    _watcher, _tried, _make_lock = None, False, threading.Lock()


forksafe.reset_function_in_child(_drop_in_child)
