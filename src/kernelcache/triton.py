"""Triton's cache hooks over kernelcache's store.

Set-up, no code::

    TRITON_CACHE_MANAGER=kernelcache.triton:KernelCacheManager

or, to keep Triton's own manager and use kernelcache as its remote tier::

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=kernelcache.triton:KernelCacheRemoteBackend

Files go to ``kernelcache.default_cache()`` (configured by ``KERNELCACHE_DIR`` and the other
``KERNELCACHE_*`` variables), checked on every read like any entry: a group (a compiled
kernel) is one entry holding all its members, a single file (a launcher ``.so``) one entry
of its own (integrations/triton_files.py). Of a group, only what Triton needs to load the
kernel is stored (the binary and the metadata JSON); its IRs (source, TTIR, TTGIR, LLIR, PTX)
only with ``TRITON_STORE_BINARY_ONLY=0``.

Triton wants paths back; those are copies under the cache root
(kernelcache.integrations.materialized), never the entries themselves: a single file (read
with ``get_file``, or just ``put``) gets a copy shared by every process, a hard link to its
entry file where possible (no second copy of the bytes, no new inode; one path for a module
imported twice); a group's members (parts of one entry, which cannot be linked to) get scratch
copies of this process, read by Triton at once and removed when it exits. So at rest a kernel
costs its entry only (benchmarks/bench_triton_disk.py measures both managers). One compile per
kernel across processes and hosts: a miss in ``get_group`` holds the kernel's single flight
until ``put_group`` (integrations/triton_files.py: lead_or_wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import weakref
from typing import Any

try:
    from triton.runtime.cache import CacheManager, FileCacheManager, RemoteCacheBackend
except ModuleNotFoundError as exc:  # pragma: no cover - exercised where triton is absent
    # A ModuleNotFoundError, as for kernelcache.cupy: a missing extra reads as missing.
    raise ModuleNotFoundError(
        "kernelcache.triton needs Triton: install it with `pip install 'kernelcache[triton]'`", name=exc.name
    ) from exc

from kernelcache import config, forksafe
from kernelcache.integrations.materialized import check_file_name, materialize, remove_owner
from kernelcache.integrations.triton_dir import inductor_loaded, inductors_group, mirror_group
from kernelcache.integrations.triton_files import TritonFiles, is_plain, private_root, release, warn_once
from kernelcache.regular_file import read_regular
from kernelcache.stores.base import ProgramCacheResource

__all__ = ["KernelCacheManager", "KernelCacheRemoteBackend", "inductor_loaded", "mirror_group"]

_GROUP_PREFIX = "__grp__"  # Triton's name for a group's own file
# A kernel's IRs, which Triton itself drops with TRITON_STORE_BINARY_ONLY=1 (it keeps the
# binary and the JSON); every other file (launcher .so, autotuning results) is stored.
_IR_EXTS = ("source", "ttir", "ttgir", "llir", "ptx", "amdgcn", "mlir")
# What Triton names a group's members: "<kernel name>.<stage>" (compiler.py; a kernel name
# is an identifier, so no dot before the stage). Such a file is stored only as part of its
# group: a single entry of its own would double the kernel's bytes and inodes. Every other
# file (a launcher "<module>.cpython-311-x86_64-linux-gnu.so", "<fn>.autotune.json") is one.
_MEMBER_EXTS = (*_IR_EXTS, "cubin", "hsaco", "json")
# Roots this process put scratch copies under, with the store whose cap counts them (None: a
# private root, no store's).
_scratch_roots: dict[str, Any] = {}
# This process's scratch folder: its pid and a random part, so two processes of one pid on
# two hosts sharing a cache (a team cache on NFS) never remove each other's copies at exit.
_scratch = {"owner": f"{os.getpid()}-{os.urandom(4).hex()}"}


def _stores_irs() -> bool:
    """IRs are stored only when TRITON_STORE_BINARY_ONLY says 0 (or false/no/off)."""
    return os.environ.get("TRITON_STORE_BINARY_ONLY", "").strip().lower() in ("0", "false", "no", "off")


def _member_like(name: str) -> bool:
    """Whether Triton names group members so (they reach the store with their group only)."""
    stem, _, ext = name.rpartition(".")
    return bool(stem) and "." not in stem and ext in _MEMBER_EXTS


def _needed(name: str) -> bool:
    """Whether a file is kept in the store (not: an IR Triton keeps only for debugging)."""
    return name.rsplit(".", 1)[-1] not in _IR_EXTS or _stores_irs()


def _remove_scratch() -> None:
    # Only this process's own scratch directory, under roots it used; the bytes they gave
    # back leave the store's size tracker (they were counted when written: one budget).
    for root, budget in list(_scratch_roots.items()):
        given = remove_owner(root, _scratch["owner"])
        if budget is not None and given:
            with contextlib.suppress(Exception):  # exit goes on whatever the counters file does
                budget.copies_freed(given)


forksafe.at_exit(_remove_scratch)


def _after_fork_in_child() -> None:
    # The child's copies are its own (its own folder, removed at its own exit): the parent's
    # folder is the parent's to remove.
    _scratch_roots.clear()
    _scratch["owner"] = f"{os.getpid()}-{os.urandom(4).hex()}"


forksafe.reset_function_in_child(_after_fork_in_child)


def _release_all(flights: dict[str, Any]) -> None:
    while flights:
        release(flights.popitem()[1])


def _as_bytes(data: Any) -> bytes:
    # Triton passes bytes for binaries and str (or IR objects whose str() is the text) for
    # the rest; its FileCacheManager writes str(data), its RemoteCacheManager UTF-8 encodes it.
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


def _store_and_root() -> tuple[ProgramCacheResource | None, str]:
    """The default store, and where its copies go: the root of its file tier (a root the
    store accepted), else this user's private directory (never the configured directory the
    store refused: another user could plant or swap files there).

    None when the default cache directory cannot be used (a read-only HOME, a root another
    user owns): warned once by default_cache_or_none; Triton then compiles as without us.
    """
    from kernelcache.stores.default import default_cache_or_none

    store = default_cache_or_none()
    if store is None:
        return None, ""
    root = store.file_root
    if root is not None:
        return store, root
    try:
        return store, private_root()
    except OSError as exc:
        warn_once("private-root", f"no directory for copies ({exc}); Triton keeps its own files")
        return store, ""


class KernelCacheManager(CacheManager):
    """Triton cache manager storing in kernelcache's default store.

    Triton calls ``cls(key)``; ``cls(key, dump=True)`` and ``cls(key, override=True)``
    (TRITON_KERNEL_DUMP, TRITON_KERNEL_OVERRIDE) behave exactly as Triton's own
    FileCacheManager, to which they are delegated. ``get_file``/``put``/``get_group`` return
    paths of copies under the cache root; ``get_group`` returns the whole group or None.
    """

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        check_file_name(key)
        self._delegate: FileCacheManager | None = None
        if override or dump or config.disabled():
            # KERNELCACHE_DISABLE: kernelcache's store is neither read nor written; Triton
            # caches as it would without us.
            self._delegate = FileCacheManager(key, override=override, dump=dump)
            return
        store, self._root = _store_and_root()
        if store is None:  # no usable cache: Triton's own manager, as without kernelcache
            self._delegate = FileCacheManager(key)
            return
        self._files = TritonFiles(key, store)
        # One budget: copies under the store's file tier count under its cap (its eviction
        # takes entries and copies alike). Under a private root, this process's own cap.
        self._budget = self._files.file_tier() if self._root == store.file_root else None
        self._cap = config.max_size_bytes()
        self._first_put: float | None = None
        self._put: dict[str, bytes] = {}  # what this manager put: get_file answers from it
        self._single: set[str] = set()  # what it stored as single files: their copies are shared links
        # Single flight of each group this manager is to compile (lead_or_wait), held from the
        # miss in get_group to put_group; let go when the manager goes (a compile that raised)
        # or the process ends, so peers never wait past a failed compile.
        self._flights: dict[str, Any] = {}
        weakref.finalize(self, _release_all, self._flights)

    def _path(self, name: str, data: bytes, *, link: str | None = None) -> str | None:
        """A shared copy linked to the entry file ``link``; without one a scratch copy."""
        if not self._root:
            return None  # no directory a copy may go to: a miss, and Triton's own files on put
        if link is None:
            _scratch_roots[self._root] = self._budget
        namespace, owner = ("triton", None) if link is not None else ("scratch", _scratch["owner"])
        try:
            return materialize(
                self._root, namespace, owner, name, data, link_from=link, budget=self._budget, cap=self._cap
            )
        except OSError as exc:
            warn_once(f"materialize-{exc.errno}", f"cannot write a copy under {self._root}: {exc}")
            return None

    def get_file(self, filename: str) -> str | None:
        if self._delegate is not None:
            return self._delegate.get_file(filename)
        check_file_name(filename)
        if filename in self._put:  # what this manager put (a member reaches the store with its group only)
            return self._put_path(filename, self._put[filename])
        data = self._files.get(filename)
        if data is not None:
            return self._path(filename, data, link=self._files.entry_file(filename))
        data = self._files.get_member(filename)
        return None if data is None else self._path(filename, data)

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        if self._delegate is not None:
            return self._delegate.put(data, filename, binary=binary)
        check_file_name(filename)
        payload = _as_bytes(data)
        keep = _needed(filename)
        if self._first_put is None:
            self._first_put = time.monotonic()  # Triton's first put comes as its compile starts
        if keep and not _member_like(filename) and self._files.put(filename, payload):
            self._single.add(filename)  # a dropped write has warned; the path still works
        # A member waits for put_group (a member put without one, as a compile that failed
        # midway leaves it, is never stored); until then get_file answers from here.
        self._put[filename] = payload
        path = self._put_path(filename, payload)
        if path is None:
            # The cache root cannot be written: Triton's own directory still can be, and a
            # cache must not fail a compile that works without it.
            path = FileCacheManager(self.key).put(data, filename, binary=binary)
        return path

    def _put_path(self, name: str, data: bytes) -> str | None:
        """The path of what this manager put: a single file's is the shared copy linked to its
        entry, the path any process's get_file gives for it (Triton imports a launcher module
        from it, and a module imported twice must come from one path); a member's a scratch copy."""
        if name in self._single:
            path = self._path(name, data, link=self._files.entry_file(name))
            if path is not None:
                return path
        return self._path(name, data)

    def get_group(self, filename: str) -> dict[str, str] | None:
        if config.record_path() is not None:  # KERNELCACHE_RECORD: the kernels this run needed
            from kernelcache.compile import lockfile  # imported only then: a hit stays light

            lockfile.record_triton(self.key, filename)
        if self._delegate is not None:
            return self._delegate.get_group(filename)
        check_file_name(filename)
        members = self._files.get_group(filename)
        if members is not None:
            # The store counted the hit (the manifest's read); the compile it saved is ours to add.
            self._files.count_saved()
        if members is None:
            from kernelcache.compile import strict

            strict.on_triton_miss(self.key, filename)  # KERNELCACHE_REQUIRE_HIT=1 raises: Triton compiles nothing
            if filename not in self._flights:
                # One compile per kernel across threads, processes and hosts: a peer compiling
                # this key is waited for (its group then read), or this manager leads it.
                held, members = self._files.lead_or_wait(filename)
                if held is not None:
                    self._flights[filename] = held
        if members is None:
            # Inductor emits the kernels its FX-graph entries carry into Triton's own
            # directory; Triton's own manager would load them from there, and so do we.
            return inductors_group(self.key, filename) if inductor_loaded() else None
        if inductor_loaded():
            # Inductor loads the kernel from Triton's directory by path (its static launcher,
            # its bundles). Triton itself gets our own copies of the checked bytes: a peer
            # writing another version of this key into Triton's directory replaces its files
            # one by one, and a group read there meanwhile could mix two versions.
            mirror_group(self.key, filename, members)
        paths = {}
        for name, data in members.items():
            path = self._path(name, data)
            if path is None:
                return None  # all or nothing
            paths[name] = path
        return paths

    def put_group(self, filename: str, group: dict[str, str]) -> str | None:
        """Store the group whose members Triton wrote with ``put`` (name -> path)."""
        if self._delegate is not None:
            return self._delegate.put_group(filename, group)
        check_file_name(filename)
        members = {}
        for name, path in group.items():
            if not _needed(name):
                continue  # an IR Triton keeps only for debugging: not part of the stored group
            if name in self._put:  # what Triton put here: its bytes, whether or not its copy is still there
                members[check_file_name(name)] = self._put[name]
                continue
            try:  # a path Triton gave: a FIFO planted there is refused, never waited on
                members[check_file_name(name)] = read_regular(path)
            except OSError as exc:
                warn_once(f"group-read-{exc.errno}", f"cannot read group member {path}: {exc}; group not stored")
                return None
        seconds = None if self._first_put is None else time.monotonic() - self._first_put
        self._files.put_group(filename, members, seconds)
        held = self._flights.pop(filename, None)
        if held is not None:
            release(held)  # stored: the peers waiting for this kernel read it now
        if inductor_loaded():
            mirror_group(self.key, filename, members)
        # Race: Triton reads every path put gave it only now (CompiledKernel, after the last
        # stage), and a compile can take minutes: a sweep by any process over the copies' cap
        # may have removed the early copies (older than MIN_AGE_S) meanwhile. Each is put
        # back at its path (named by its content), its age reset, before Triton reads it.
        for name, path in group.items():
            if name in self._put and os.path.basename(path).endswith(f"-{name}"):
                self._path(name, self._put[name])
        # Triton ignores the result; like its FileCacheManager, return the group file's path.
        # Nothing reads it back (get_group reads the store): a scratch copy, gone at exit.
        return self._path(_GROUP_PREFIX + filename, json.dumps({"child_paths": group}).encode())

    def close(self) -> None:
        """Nothing to release: the store is the process-wide default cache."""

    def __enter__(self) -> KernelCacheManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class KernelCacheRemoteBackend(RemoteCacheBackend):
    """Triton remote cache backend (TRITON_REMOTE_CACHE_BACKEND) over kernelcache's store.

    Triton's RemoteCacheManager reads a group as ``get(["__grp__<name>"])`` followed by
    ``get(<members>)`` on the same backend; the first call reads and checks the whole group
    here and keeps it, the second is answered from it, so the members handed out always
    belong to one complete group.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        # KERNELCACHE_DISABLE, or no usable cache (warned once): a backend that holds
        # nothing and stores nothing, so Triton compiles.
        store = None if config.disabled() else _store_and_root()[0]
        self._files = TritonFiles(key, store) if store is not None else None
        self._from_group: dict[str, bytes] = {}  # members of the groups read by this backend
        self._written: dict[str, bytes] = {}  # files put by this backend (a group's members)

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        if self._files is None:
            return found
        for name in filenames:
            if name.startswith(_GROUP_PREFIX):
                members = self._files.get_group(name[len(_GROUP_PREFIX) :])
                if members is None:
                    continue
                self._from_group.update(members)
                found[name] = json.dumps({"child_paths": sorted(members)}).encode()
            elif name in self._from_group:
                found[name] = self._from_group[name]
            else:
                data = self._files.get(name)
                if data is None:
                    data = self._files.get_member(name)
                if data is not None:
                    found[name] = data
        return found

    def put(self, filename: str, data: bytes) -> None:
        check_file_name(filename)  # a name that is a path is refused, as KernelCacheManager.put does
        if self._files is None:
            return
        payload = _as_bytes(data)
        if not filename.startswith(_GROUP_PREFIX):
            if not _member_like(filename):  # a member is stored with its group (as by KernelCacheManager)
                self._files.put(filename, payload)
            self._written[filename] = payload
            return
        try:
            children = json.loads(payload)["child_paths"]
        except (ValueError, KeyError, TypeError):
            warn_once("group-format", f"group file {filename!r} is not Triton's group JSON; not stored")
            return
        if not isinstance(children, list) or not all(is_plain(child) for child in children):
            warn_once("group-format", f"group file {filename!r} names a file that is not a plain name; not stored")
            return
        members = {}
        for child in children:
            got = self._written.get(child)
            if got is None:
                got = self._files.get(child, internal=True)
            if got is None:
                return  # a member nobody stored: no group (readers would have to miss on it)
            members[child] = got
        self._files.put_group(filename[len(_GROUP_PREFIX) :], members)

    def close(self) -> None:
        """Nothing to release: the store is the process-wide default cache."""

    def __enter__(self) -> KernelCacheRemoteBackend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
