"""What header look-ups learned, kept per cache and across processes: each header's content
digest by its file's identity, and each searched directory's entries by the directory's.

A hit must vouch for every header a variant names (its content) and for every name the source
probes (where it resolves now: which files exist before it on the search path). Proved from
scratch, that is a read and a hash per header and a stat per place tried: thousands of calls
per kernel for real include trees, in every fresh process. So the facts are remembered:
- ``files``: path -> "device inode size mtime_ns ctime_ns SHA-256-of-the-content" (one string:
  a process that reads the index builds no container per header, none for its garbage
  collector to trace: hundreds of lists tipped a fresh process into a full collection);
- ``dirs``: directory -> (device, inode, mtime_ns, ctime_ns, its entries: regular files,
  directories, others);
- ``proofs``: a variant under a search path -> the state (identity, or none) of every
  directory its probes search, when every probe's answer came from those listings: while
  all of them keep that state, every probe still resolves where it did.
A fact is used only while a stat of its file or directory gives the same identity. The ctime is
in it: the kernel sets it on every change (write, rename, chmod) and no call can set it back,
so a file rewritten in any way no longer matches its fact. A directory's mtime and ctime change
whenever an entry is created, removed or renamed in it, so its listing proves every presence
and absence of a regular file in it; an entry that is a symlink (or anything but a regular file
or a directory) is not proved by its directory, since its target can change: it is stat'ed.
A look-up then costs a stat per header and one per directory searched, nothing per place.

The racy rule (kernelcache.timestamps.changed_since) decides what may be remembered: a file or
directory stamped within its filesystem's granularity of the moment it was read can change
again in that same tick without changing its identity, so such a fact is used once and not
kept. A directory whose identity changed while it was listed is not used at all.

Where: one file per cache root and user, ``<root>/v2/index/headers-<uid>.json`` (a store
without a root keeps the facts in this process only). A file of another user is never read
(in a team cache each member has its own; facts are cheap to learn and are not worth trusting
across users). It is read with one open (a regular file, never through a symlink) and
rewritten whole and atomically (staged in the cache's tmp/, renamed over it) after merging
what is on disk: two processes saving at once can lose each other's new facts, which costs a
read later, never a wrong answer, since every fact is checked against its file before use.

Hazards (named, as ccache's manual names its own): a filesystem that does not update directory
mtimes on entry changes, or that reuses (device, inode) with equal timestamps and size for
another file, would make a fact lie; the local Linux filesystems do neither. Network
filesystems can serve stale attributes for a while (NFS attribute caching), and then so
would a plain stat.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any

from kernelcache import forksafe
from kernelcache.headers.digests import regular_file_sha256
from kernelcache.memo import remember
from kernelcache.regular_file import NotRegularFileError, open_regular
from kernelcache.timestamps import changed_since, now_ns

FORMAT = 2  # 2: a file's fact as one string (an index of format 1 is not read: facts are relearned)
MAX_FILES = 200_000  # facts kept in one index file (the oldest go first)
MAX_DIRS = 50_000
MAX_PROOFS = 20_000
MAX_LISTED = 4096  # a directory with more entries is not listed: its names are stat'ed one by one
INDEX_DIR = "index"  # under the cache's v2/ (stores.file.marker knows it)

_ABSENT: dict[str, str] = {}  # the listing of a directory that does not exist
_UNKNOWN = None  # a directory that could not be listed now: stat the path itself


def _ident(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


class HeaderIndex:
    """The facts of one cache (``path``: its index file; None: this process only)."""

    def __init__(self, path: str | None, tmp_dir: str | None) -> None:
        self.path = path
        self.tmp_dir = tmp_dir
        self._lock = threading.Lock()
        self._files: dict[str, str] = {}
        self._dirs: dict[str, list[Any]] = {}
        self._listings: dict[str, dict[str, str]] = {}  # parsed entries of _dirs, built on use
        self._proofs: dict[str, list[Any]] = {}  # variant under a search path -> its directories' state
        # What this process proved under watch (headers.watch): path -> (digest, generation),
        # proof key -> generation; trusted without a stat while the watcher's generation stays.
        self.watched_files: dict[str, tuple[str, int]] = {}
        self.watched_proofs: dict[str, int] = {}
        self.watched_variants: dict[Any, int] = {}  # (variant digest, search dirs) -> generation
        self._new = 0  # facts learned since the last save
        self._seen: tuple[int, int, int] | None = None  # identity of the index file read last

    # -- facts --------------------------------------------------------------------------------

    def digest(self, path: str) -> str | None:
        """SHA-256 hex of the regular file at ``path`` (symlinks followed), or None if it
        cannot be read: from its fact while the file keeps that identity, else read now."""
        return self.digest_stat(path)[0]

    def digest_stat(self, path: str) -> tuple[str | None, os.stat_result | None]:
        """(digest(path), the stat it was judged by)."""
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        ident = f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} "
        known = self._files.get(path)
        if isinstance(known, str) and len(known) == len(ident) + 64 and known.startswith(ident):
            return known[len(ident) :], st
        hashed_at = now_ns()
        try:
            digest = regular_file_sha256(path)
        except OSError:
            return None, st
        if digest is not None and not changed_since(st, hashed_at):
            with self._lock:
                self._files[path] = ident + digest
                self._new += 1
        return digest, st

    def is_file(self, path: str, seen: dict[str, dict[str, str] | None]) -> tuple[bool, bool]:
        """(os.path.isfile(path), whether its directory's listing proves it): the answer comes
        from the listing where it can. ``seen``: this look-up's listings (each directory
        stat'ed once per look-up)."""
        directory, name = os.path.split(path)
        if directory not in seen:
            seen[directory] = self._listing(directory)
        listing = seen[directory]
        if listing is _UNKNOWN:
            return os.path.isfile(path), False
        kind = listing.get(name)
        if kind == "o":  # a symlink (or other): its target can change under the same directory
            return os.path.isfile(path), False
        return kind == "f", True

    # -- proofs: a variant's probes, resolved where they did, while their directories stay --

    def dir_state(self, directories: list[str]) -> tuple[list[Any], bool]:
        """(each directory's identity, 0 where there is none; whether all are safely past)."""
        state: list[Any] = []
        safe = True
        now = now_ns()
        for directory in directories:
            try:
                st = os.stat(directory)
            except OSError:
                state.append(0)
                continue
            if not stat.S_ISDIR(st.st_mode):
                state.append(0)
                continue
            state.append(_ident(st))
            safe = safe and not changed_since(st, now)
        return state, safe

    def proof_dirs(self, key: str) -> list[str] | None:
        """The directories the probes of ``key`` search, as its proof recorded them."""
        proof = self._proof(key)
        return proof[0] if proof is not None else None

    def proof_links(self, key: str) -> list[Any]:
        """The places of ``key``'s proof that no listing proves (``[path, answer]``: a symlink
        entry, a directory too big to list), checked by a stat each time the proof is used."""
        proof = self._proof(key)
        return proof[2] if proof is not None and len(proof) == 3 else []

    def proved(self, key: str, state: list[Any]) -> bool:
        """Whether the probes of ``key`` (a variant under a search path) were proved to resolve
        where they did with every directory they search in ``state``: no entry was created,
        removed or renamed in any of them since, so they still do. Its places that no listing
        proves are asked again, each by a stat: one such answer differing fails the proof."""
        proof = self._proof(key)
        if proof is None or proof[1] != state:
            return False
        return all(os.path.isfile(path) == answer for path, answer in self.proof_links(key))

    def keep_proof(self, key: str, directories: list[str], state: list[Any], links: list[Any]) -> None:
        """Remember that the probes of ``key`` resolve where they did while ``directories``
        are in ``state`` and each of ``links`` (``[path, os.path.isfile(path)]``) answers as it
        did (only a state every listing proved, safely past: see variants.variant_matches)."""
        with self._lock:
            # Without links, the form every earlier version reads; with them a third item, which
            # an earlier version takes for no proof (it proves again): never for a proof that holds.
            self._proofs[key] = [directories, state, links] if links else [directories, state]
            self._new += 1

    def _proof(self, key: str) -> list[Any] | None:
        """The proof of ``key`` if well formed (the index file is this user's, but may come from
        another version of this code: a malformed proof is no proof, never an error)."""
        proof = self._proofs.get(key)
        if not isinstance(proof, list) or len(proof) not in (2, 3) or not isinstance(proof[0], list):
            return None
        if len(proof) == 3:
            links = proof[2]
            if not isinstance(links, list) or not all(
                isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], bool) for x in links
            ):
                return None
        return proof

    def _listing(self, directory: str) -> dict[str, str] | None:
        try:
            st = os.stat(directory)
        except OSError:
            return _ABSENT
        if not stat.S_ISDIR(st.st_mode):
            return _ABSENT
        ident = _ident(st)
        known = self._dirs.get(directory)
        if known is not None and known[:4] == ident:
            listing = self._listings.get(directory)
            if listing is None:
                listing = dict.fromkeys(known[4], "f") | dict.fromkeys(known[5], "d") | dict.fromkeys(known[6], "o")
                remember(self._listings, directory, listing, MAX_DIRS)
            return listing
        listed_at = now_ns()
        try:
            with os.scandir(directory) as it:
                listing = {}
                for entry in it:
                    if len(listing) >= MAX_LISTED:
                        return _UNKNOWN
                    if entry.is_file(follow_symlinks=False):
                        listing[entry.name] = "f"
                    elif entry.is_dir(follow_symlinks=False):
                        listing[entry.name] = "d"
                    else:
                        listing[entry.name] = "o"
            after = os.stat(directory)
        except OSError:
            return _UNKNOWN
        if _ident(after) != ident:
            return _UNKNOWN  # changed while listed: no listing proves anything now
        if not changed_since(st, listed_at):
            kinds = {k: sorted(n for n, v in listing.items() if v == k) for k in "fdo"}
            with self._lock:
                self._dirs[directory] = [*ident, kinds["f"], kinds["d"], kinds["o"]]
                remember(self._listings, directory, listing, MAX_DIRS)
                self._new += 1
        return listing

    # -- the file -----------------------------------------------------------------------------

    def load(self) -> None:
        """Read the index file when it changed since this process last read it (one stat)."""
        if self.path is None:
            return
        try:
            st = os.lstat(self.path)
        except OSError:
            return
        if (st.st_ino, st.st_mtime_ns, st.st_size) == self._seen or st.st_uid != os.getuid():
            return  # unchanged since read (or written by another user: never read)
        try:
            fd, st = open_regular(self.path)
        except (OSError, NotRegularFileError):
            return
        try:
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if st.st_uid != os.getuid():
                return
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = json.loads(f.read())
        except (OSError, ValueError):
            return
        finally:
            os.close(fd)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return
        files, dirs, proofs = data.get("files"), data.get("dirs"), data.get("proofs", {})
        if not isinstance(files, dict) or not isinstance(dirs, dict) or not isinstance(proofs, dict):
            return
        with self._lock:
            # What this process learned meanwhile stays (it was checked when learned; so do the
            # listings parsed from it).
            self._files = {**files, **self._files}
            self._dirs = {**dirs, **self._dirs}
            self._proofs = {**proofs, **self._proofs}
            self._seen = seen

    def save(self) -> None:
        """Write what this process learned, merged with what the file holds now (best effort:
        a failure only means the next process learns it again)."""
        if self.path is None or self.tmp_dir is None or not self._new:
            return
        from kernelcache.stores.file import ops

        self.load()  # merge another process's facts first
        with self._lock:
            files = dict(list(self._files.items())[-MAX_FILES:])
            dirs = dict(list(self._dirs.items())[-MAX_DIRS:])
            proofs = dict(list(self._proofs.items())[-MAX_PROOFS:])
            self._new = 0
        kept = {"format": FORMAT, "files": files, "dirs": dirs, "proofs": proofs}
        raw = json.dumps(kept, separators=(",", ":")).encode()
        try:
            ops.make_dirs(os.path.dirname(self.path))
            staged = ops.stage(self.tmp_dir, raw, durable=False)
            ops.publish(staged, self.path)
            st = os.stat(self.path)
            self._seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            pass  # a read-only or full cache: the facts stay in this process


_lock = threading.Lock()
_by_path: dict[str | None, HeaderIndex] = {}


def _fresh_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for index in _by_path.values():
        index._lock = threading.Lock()
        index.watched_files.clear()  # proved under the parent's watches, which this child lacks
        index.watched_proofs.clear()
        index.watched_variants.clear()


forksafe.reset_function_in_child(_fresh_in_child)


def for_store(store: Any) -> HeaderIndex:
    """The index of ``store``'s file root (one per root and user, shared by the process's
    stores of that root), or this process's own for a store without a root."""
    root = getattr(store, "file_root", None)
    tmp_dir = getattr(store, "tmp_dir", None)
    path = None
    if isinstance(root, str) and isinstance(tmp_dir, str):
        from kernelcache.stores.file.marker import FORMAT_DIR

        path = os.path.join(root, FORMAT_DIR, INDEX_DIR, f"headers-{os.getuid()}.json")
    with _lock:
        index = _by_path.get(path)
        if index is None:
            index = HeaderIndex(path, tmp_dir)
            remember(_by_path, path, index, 64)
    index.load()
    return index
