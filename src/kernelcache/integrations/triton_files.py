"""The files of one Triton key in a kernelcache store: single files and all-or-nothing groups.

A group (Triton stores a compiled kernel as one: IRs, cubin, metadata JSON) is one manifest
entry naming each member and the SHA-256 of its bytes, written only after every member is in
the store. A reader takes the manifest, reads every member and checks each digest: a member
missing (evicted, never written because its writer died) or different (a peer rewrote it)
makes the whole group a miss there. So a reader, in any process or host, sees a complete
group of matching members or none.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import triton

from kernelcache.integrations.materialized import check_file_name
from kernelcache.log import WarnOnce
from kernelcache.stores.base import ProgramCacheResource
from kernelcache.stores.file.store import FileStreamProgramCache
from kernelcache.stores.naming import entry_name

__all__ = ["TritonFiles", "is_plain", "warn_once"]

# Domain-separated key prefixes: no key of compile_program or of the other kind can equal them.
_FILE_DOMAIN = b"kernelcache.triton.file/1\x00"
_GROUP_DOMAIN = b"kernelcache.triton.group/1\x00"
_GROUP_FORMAT = 1
_READ_ATTEMPTS = 2  # a group that changed while we read it is read once more, then a miss

_warned = WarnOnce("kernelcache.triton")


def warn_once(cause: str, message: str) -> None:
    """One KernelCacheWarning (and log line) per cause per process, worded for Triton."""
    _warned.warn(cause, message, stacklevel=3, origin="triton")


def is_plain(name: object) -> bool:
    """Whether ``name`` is a plain file name (what check_file_name accepts)."""
    if not isinstance(name, str):
        return False
    try:
        check_file_name(name)
    except ValueError:
        return False
    return True


class TritonFiles:
    """The files of one Triton key in a kernelcache store: single files and groups."""

    def __init__(self, key: str, store: ProgramCacheResource) -> None:
        self.key = key
        self.store = store
        self._prefix = key.encode("utf-8") + b"\x00"

    def _file_key(self, name: str) -> bytes:
        return _FILE_DOMAIN + self._prefix + name.encode("utf-8")

    saved_seconds = 0.0  # the compile time the group last read saves (its writer measured it)

    def count_saved(self) -> None:
        """Add the compile the group last read saved to the store's counters (a store that
        cannot count is left alone: counting never fails a load)."""
        try:
            self.store.add_stats(compile_us_saved=int(self.saved_seconds * 1e6))
        except Exception:
            pass

    def entry_file(self, name: str) -> str | None:
        """The file holding member ``name`` in the store's file tier, if it has one (a hard
        link to it is a copy that costs no bytes); None: no file tier."""
        for tier in [self.store, *getattr(self.store, "tiers", ())]:
            if isinstance(tier, FileStreamProgramCache):
                return tier.entry_path(entry_name(self._file_key(name)))
        return None

    def size_cap(self) -> int | None:
        """The byte cap of the store's file tier (None: it has none)."""
        for tier in [self.store, *getattr(self.store, "tiers", ())]:
            if isinstance(tier, FileStreamProgramCache):
                return tier.max_size_bytes
        return None

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

    def _group_meta(self, members: dict[str, bytes], compile_seconds: float | None = None) -> dict[str, Any]:
        """What ``kernelcache ls``/``show`` print for the group: one row per Triton kernel,
        with its name and arch (from Triton's metadata JSON), its members and their bytes."""
        info = _kernel_info(members)
        meta: dict[str, Any] = {
            "kind": "triton-group",
            "code_type": "triton",
            "target_type": "group",
            "kernels": [info.get("name") or "?"],
            "members": {member: len(data) for member, data in sorted(members.items())},
            "group_bytes": sum(len(data) for data in members.values()),
            "options": {"arch": info.get("arch") or "?"},
            "triton_key": self.key,
            "triton_version": triton.__version__,
        }
        if compile_seconds is not None:
            meta["compile_seconds"] = compile_seconds
        return meta

    @staticmethod
    def _manifest(members: dict[str, bytes]) -> bytes:
        digests = {member: hashlib.sha256(data).hexdigest() for member, data in members.items()}
        return json.dumps({"format": _GROUP_FORMAT, "members": digests}, sort_keys=True).encode()

    def put(self, name: str, data: bytes) -> bool:
        return self.store.set_record(self._file_key(name), data, self._member_meta(name))

    def put_group(self, name: str, members: dict[str, bytes], compile_seconds: float | None = None) -> bool:
        """Store every member that the store does not hold as given, then the manifest
        (``compile_seconds``: what a hit on this group saves, as ``stats`` counts it)."""
        for member, data in members.items():
            # Re-put a member a peer replaced since we wrote it (or that was evicted): the
            # manifest must name bytes that are in the store now, or readers would miss on
            # it until the next compile.
            if self.get(member, internal=True) != data and not self.put(member, data):
                return False  # a member that is not stored makes no group
        # Last write: until it lands, readers see no group (a writer killed before this
        # line leaves members only, which nobody reads as a group).
        meta = self._group_meta(members, compile_seconds)
        return self.store.set_record(self._group_key(name), self._manifest(members), meta)

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
        saved = record[1].get("compile_seconds") if isinstance(record[1], dict) else None
        self.saved_seconds = float(saved) if isinstance(saved, (int, float)) else 0.0
        try:
            manifest = json.loads(record[0])
            digests = manifest["members"]
            if manifest.get("format") != _GROUP_FORMAT or not isinstance(digests, dict):
                raise ValueError("unknown group format")
        except (ValueError, KeyError, TypeError):
            return None  # a format this version does not know: a miss
        if not all(is_plain(member) for member in digests):
            # Written by another writer (any host sharing an unsigned store): a member
            # named "../x" would make Triton's own file manager (RemoteCacheManager) write
            # outside its directory, and our copies cannot be named so. A miss.
            warn_once("group-names", f"group {name!r} names a file that is not a plain name; a miss")
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


def _kernel_info(members: dict[str, bytes]) -> dict[str, str]:
    """The kernel's name and arch from Triton's metadata JSON among the members ({} if none)."""
    for member, data in members.items():
        if not member.endswith(".json") or member.startswith("__grp__"):
            continue
        try:
            meta = json.loads(data)
        except ValueError:
            continue
        if not isinstance(meta, dict) or "name" not in meta:
            continue
        target = meta.get("target") if isinstance(meta.get("target"), dict) else {}
        arch = target.get("arch")
        backend = target.get("backend", "")
        spelled = f"sm_{arch}" if backend == "cuda" and isinstance(arch, int) else f"{backend}:{arch}" if arch else ""
        return {"name": str(meta["name"]), "arch": spelled}
    return {}
