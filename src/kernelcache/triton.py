"""Triton's cache hooks over kernelcache's store.

Set-up, no code::

    TRITON_CACHE_MANAGER=kernelcache.triton:KernelCacheManager

or, to keep Triton's own manager and use kernelcache as its remote tier::

    TRITON_CACHE_MANAGER=triton.runtime.cache:RemoteCacheManager
    TRITON_REMOTE_CACHE_BACKEND=kernelcache.triton:KernelCacheRemoteBackend

Files go to ``kernelcache.default_cache()`` (configured by ``KERNELCACHE_DIR`` and the other
``KERNELCACHE_*`` variables), one entry per (Triton key, file name), checked on every read
like any entry. Triton wants paths back; those are copies under the cache root
(kernelcache.integrations.materialized), never the entries themselves.

Groups (Triton stores a compiled kernel as a group: IRs, cubin, metadata JSON) are all or
nothing. A group is one manifest entry naming each member and the SHA-256 of its bytes,
written only after every member is in the store. A reader takes the manifest, reads every
member and checks each digest: a member missing (evicted, never written because its writer
died) or different (a peer rewrote it) makes the whole group a miss. So a reader, in any
process or host, sees a complete group of matching members or none.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

try:
    import triton
    from triton.runtime.cache import CacheManager, FileCacheManager, RemoteCacheBackend
except ModuleNotFoundError as exc:  # pragma: no cover - exercised where triton is absent
    # A ModuleNotFoundError, as for kernelcache.cupy: a missing extra reads as missing.
    raise ModuleNotFoundError(
        "kernelcache.triton needs Triton: install it with `pip install 'kernelcache[triton]'`", name=exc.name
    ) from exc

from kernelcache import config
from kernelcache.compile import lockfile, strict
from kernelcache.integrations.materialized import check_file_name, materialize, private_root
from kernelcache.log import WarnOnce
from kernelcache.stores.base import ProgramCacheResource

__all__ = ["KernelCacheManager", "KernelCacheRemoteBackend"]

# Domain-separated key prefixes: no key of compile_program or of the other kind can equal them.
_FILE_DOMAIN = b"kernelcache.triton.file/1\x00"
_GROUP_DOMAIN = b"kernelcache.triton.group/1\x00"
_GROUP_FORMAT = 1
_GROUP_PREFIX = "__grp__"  # Triton's name for a group's own file
_READ_ATTEMPTS = 2  # a group that changed while we read it is read once more, then a miss

_warned = WarnOnce("kernelcache.triton")


def _warn_once(cause: str, message: str) -> None:
    _warned.warn(cause, message, stacklevel=3, origin="triton")


def _as_bytes(data: Any) -> bytes:
    # Triton passes bytes for binaries and str (or IR objects whose str() is the text) for
    # the rest; its FileCacheManager writes str(data), its RemoteCacheManager UTF-8 encodes it.
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


def _is_plain(name: object) -> bool:
    """Whether ``name`` is a plain file name (what check_file_name accepts)."""
    if not isinstance(name, str):
        return False
    try:
        check_file_name(name)
    except ValueError:
        return False
    return True


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
        _warn_once("private-root", f"no directory for copies ({exc}); Triton keeps its own files")
        return store, ""


class _TritonFiles:
    """The files of one Triton key in a kernelcache store: single files and groups."""

    def __init__(self, key: str, store: ProgramCacheResource) -> None:
        self.key = key
        self.store = store
        self._prefix = key.encode("utf-8") + b"\x00"

    def _file_key(self, name: str) -> bytes:
        return _FILE_DOMAIN + self._prefix + name.encode("utf-8")

    def get(self, name: str, *, internal: bool = False) -> bytes | None:
        record = self.store.get_record(self._file_key(name), internal=internal)
        return None if record is None else record[0]

    def _member_meta(self, name: str) -> dict[str, Any]:
        ext = name.rsplit(".", 1)[-1] if "." in name else ""
        return {
            "kind": "triton",
            "code_type": "triton",
            "target_type": ext or "file",
            "kernels": [name],
            "triton_key": self.key,
            "triton_version": triton.__version__,
        }

    def _group_meta(self, members: dict[str, bytes]) -> dict[str, Any]:
        return {
            "kind": "triton-group",
            "code_type": "triton",
            "target_type": "group",
            "kernels": sorted(members),
            "triton_key": self.key,
            "triton_version": triton.__version__,
        }

    @staticmethod
    def _manifest(members: dict[str, bytes]) -> bytes:
        digests = {member: hashlib.sha256(data).hexdigest() for member, data in members.items()}
        return json.dumps({"format": _GROUP_FORMAT, "members": digests}, sort_keys=True).encode()

    def put(self, name: str, data: bytes) -> bool:
        return self.store.set_record(self._file_key(name), data, self._member_meta(name))

    def put_group(self, name: str, members: dict[str, bytes]) -> bool:
        """Store every member that the store does not hold as given, then the manifest."""
        for member, data in members.items():
            # Re-put a member a peer replaced since we wrote it (or that was evicted): the
            # manifest must name bytes that are in the store now, or readers would miss on
            # it until the next compile.
            if self.get(member, internal=True) != data and not self.put(member, data):
                return False  # a member that is not stored makes no group
        # Last write: until it lands, readers see no group (a writer killed before this
        # line leaves members only, which nobody reads as a group).
        return self.store.set_record(self._group_key(name), self._manifest(members), self._group_meta(members))

    def get_group(self, name: str) -> dict[str, bytes] | None:
        """Every member of the group, each matching the manifest's digest; else None.

        A group found but not verifying through the tiers together (a host's local tiers
        holding a manifest and members of two writers' versions) is read from each tier
        alone, nearest first: the first complete one is returned and replaces the group in
        the tiers above it. So a stale local copy never shadows a complete group further down.
        """
        members = None
        for _ in range(_READ_ATTEMPTS):
            members = self._read_group(self.store, name)
            if members != "unverified":
                return members  # type: ignore[return-value]
        tiers = list(getattr(self.store, "tiers", ()))
        for i, tier in enumerate(tiers):
            found = self._read_group(tier, name)
            if isinstance(found, dict):
                self._replace_above(tiers[:i], name, found)
                return found
        return None

    def _group_key(self, name: str) -> bytes:
        return _GROUP_DOMAIN + self._prefix + name.encode("utf-8")

    def _read_group(self, store: ProgramCacheResource, name: str) -> dict[str, bytes] | str | None:
        """The verified members from ``store``; None: no group there (or one this version
        cannot read); "unverified": a manifest whose members do not all match it."""
        record = store.get_record(self._group_key(name), internal=store is not self.store)
        if record is None:
            return None
        try:
            manifest = json.loads(record[0])
            digests = manifest["members"]
            if manifest.get("format") != _GROUP_FORMAT or not isinstance(digests, dict):
                raise ValueError("unknown group format")
        except (ValueError, KeyError, TypeError):
            return None  # a format this version does not know: a miss
        if not all(_is_plain(member) for member in digests):
            # Written by another writer (any host sharing an unsigned store): a member
            # named "../x" would make Triton's own file manager (RemoteCacheManager) write
            # outside its directory, and our copies cannot be named so. A miss.
            _warn_once("group-names", f"group {name!r} names a file that is not a plain name; a miss")
            return None
        members: dict[str, bytes] = {}
        # Every member in one round trip per tier (a remote tier answers them together).
        found = store.get_many([self._file_key(m) for m in digests], internal=True)
        for (member, digest), got in zip(digests.items(), found):
            data = None if got is None else got[0]
            # Race: a peer rewrote this member (with other bytes) after our manifest
            # was written, or evicted it. The digest catches both; the caller reads once
            # more in case the peer's own manifest has landed meanwhile.
            if data is None or hashlib.sha256(data).hexdigest() != digest:
                return "unverified"
            members[member] = data
        return members

    def _replace_above(self, tiers: list[ProgramCacheResource], name: str, members: dict[str, bytes]) -> None:
        """Write a verified group into ``tiers`` (members first, the manifest last, as put_group)."""
        # Race: another host may rewrite the group meanwhile; each tier then holds one
        # writer's members or another's, and the manifest written last names ours, which a
        # reader verifies (a mismatch is a miss there and a fall-through again).
        for tier in tiers:
            if tier.read_only:
                continue
            for member, data in members.items():
                tier.set_record(self._file_key(member), data, self._member_meta(member), internal=True)
            tier.set_record(self._group_key(name), self._manifest(members), self._group_meta(members), internal=True)


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
        self._files = _TritonFiles(key, store)

    def _path(self, name: str, data: bytes) -> str | None:
        if not self._root:
            return None  # no directory a copy may go to: a miss, and Triton's own files on put
        try:
            return materialize(self._root, "triton", self.key, name, data)
        except OSError as exc:
            _warn_once(f"materialize-{exc.errno}", f"cannot write a copy under {self._root}: {exc}")
            return None

    def get_file(self, filename: str) -> str | None:
        if self._delegate is not None:
            return self._delegate.get_file(filename)
        check_file_name(filename)
        data = self._files.get(filename)
        return None if data is None else self._path(filename, data)

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        if self._delegate is not None:
            return self._delegate.put(data, filename, binary=binary)
        check_file_name(filename)
        payload = _as_bytes(data)
        self._files.put(filename, payload)  # a dropped write has warned; the path still works
        path = self._path(filename, payload)
        if path is None:
            # The cache root cannot be written: Triton's own directory still can be, and a
            # cache must not fail a compile that works without it.
            path = FileCacheManager(self.key).put(data, filename, binary=binary)
        return path

    def get_group(self, filename: str) -> dict[str, str] | None:
        lockfile.record_triton(self.key, filename)  # KERNELCACHE_RECORD: the kernels this run needed
        if self._delegate is not None:
            return self._delegate.get_group(filename)
        check_file_name(filename)
        members = self._files.get_group(filename)
        if members is None:
            strict.on_triton_miss(self.key, filename)  # KERNELCACHE_REQUIRE_HIT=1 raises: Triton compiles nothing
            return None
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
            try:
                with open(path, "rb") as f:
                    members[check_file_name(name)] = f.read()
            except OSError as exc:
                _warn_once(f"group-read-{exc.errno}", f"cannot read group member {path}: {exc}; group not stored")
                return None
        self._files.put_group(filename, members)
        # Triton ignores the result; like its FileCacheManager, return the group file's path.
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
        self._files = _TritonFiles(key, store) if store is not None else None
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
                if data is not None:
                    found[name] = data
        return found

    def put(self, filename: str, data: bytes) -> None:
        check_file_name(filename)  # a name that is a path is refused, as KernelCacheManager.put does
        if self._files is None:
            return
        payload = _as_bytes(data)
        if not filename.startswith(_GROUP_PREFIX):
            self._files.put(filename, payload)
            self._written[filename] = payload
            return
        try:
            children = json.loads(payload)["child_paths"]
        except (ValueError, KeyError, TypeError):
            _warn_once("group-format", f"group file {filename!r} is not Triton's group JSON; not stored")
            return
        if not isinstance(children, list) or not all(_is_plain(child) for child in children):
            _warn_once("group-format", f"group file {filename!r} names a file that is not a plain name; not stored")
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
