"""The files of one Triton key in a kernelcache store: single files and all-or-nothing groups.

A group (Triton stores a compiled kernel as one: cubin, metadata JSON, IRs) is ONE record
holding every member (triton_pack.py), checked as a whole by the tier that serves it. So a
reader, in any process or host, gets a complete group of one writer's members or none, and a
kernel costs one entry: in the file tier two inodes (entry + sidecar), fewer than Triton's own
directory per kernel. The members come to Triton as copies (integrations/materialized.py).

A single file (a launcher ``.so``, autotuning results) is one record of its own. Keys
(domain-separated, so no key of compile_program or of the other kind can equal them)::

    kernelcache.triton.file/1 \0 <triton key> \0 <file name>     a single file
    kernelcache.triton.group/2 \0 <triton key> \0 <group name>   a packed group

A group of the previous layout (``group/1``: a manifest of member digests, each member a
single file) is not read as a group: it is a miss, and the kernel is compiled and stored again
as one record. Its single files are left alone (a process of that version may still read them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from typing import Any

from kernelcache import forksafe
from kernelcache.compile.flight import ACQUIRED, READY, SingleFlight
from kernelcache.integrations.materialized import check_file_name
from kernelcache.integrations.triton_pack import pack, unpack
from kernelcache.log import WarnOnce
from kernelcache.stores.base import ProgramCacheResource
from kernelcache.stores.file import locks as lockfiles
from kernelcache.stores.file.store import FileStreamProgramCache
from kernelcache.stores.naming import entry_name

__all__ = ["TritonFiles", "is_plain", "private_root", "release", "warn_once"]

_FILE_DOMAIN = b"kernelcache.triton.file/1\x00"
_GROUP_DOMAIN = b"kernelcache.triton.group/2\x00"

_warned = WarnOnce("kernelcache.triton")


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
        """The file holding single file ``name`` in the store's file tier, if it has one (a
        hard link to it is a copy that costs no bytes or inode); None: no file tier."""
        for tier in [self.store, *getattr(self.store, "tiers", ())]:
            if isinstance(tier, FileStreamProgramCache):
                return tier.entry_path(entry_name(self._file_key(name)))
        return None

    def file_tier(self) -> FileStreamProgramCache | None:
        """The store's file tier (whose cap counts the copies under its root), if it has one."""
        for tier in [self.store, *getattr(self.store, "tiers", ())]:
            if isinstance(tier, FileStreamProgramCache):
                return tier
        return None

    def get(self, name: str, *, internal: bool = False) -> bytes | None:
        """The single file ``name`` (None: not stored as one)."""
        record = self.store.get_record(self._file_key(name), internal=internal)
        return None if record is None else record[0]

    def get_member(self, name: str) -> bytes | None:
        """File ``name`` as a member of the group named after its stem (``k.cubin`` in
        ``k.json``, as Triton names them), for a ``get_file`` that found no single file.
        An internal read: the miss of ``get`` before it stays the one counted."""
        stem = name.rsplit(".", 1)[0]
        if stem == name:
            return None
        record = self.store.get_record(self._group_key(f"{stem}.json"), internal=True)
        group = None if record is None else unpack(record[0], record[1], is_plain)
        return None if group is None else group.get(name)

    # The metadata holds what the tools print or read, nothing more: every entry pays its
    # bytes. The Triton version is not repeated (Triton's key covers it), nor a single file's
    # Triton key (`ls` lists no single file, `show` prints no Triton key); a group keeps its
    # key, the kernel's identity for whoever reads the metadata.

    @staticmethod
    def _member_meta(name: str) -> dict[str, Any]:
        ext = name.rsplit(".", 1)[-1] if "." in name else ""
        return {"kind": "triton", "code_type": "triton", "target_type": ext or "file", "kernels": [name]}

    def _group_meta(
        self, members: dict[str, bytes], sizes: dict[str, int], compile_seconds: float | None
    ) -> dict[str, Any]:
        """The group record's metadata: how to unpack it (``sizes``), and what ``kernelcache
        ls``/``show`` print: one row per Triton kernel, with its name and arch (from Triton's
        metadata JSON), its members and their bytes (the entry's size is the group's: its
        payload is the members' bytes)."""
        info = _kernel_info(members)
        meta: dict[str, Any] = {
            "kind": "triton-group",
            "code_type": "triton",
            "target_type": "group",
            "kernels": [info.get("name") or "?"],
            "members": sizes,
            "options": {"arch": info.get("arch") or "?"},
            "triton_key": self.key,
        }
        if compile_seconds is not None:
            meta["compile_seconds"] = round(compile_seconds, 3)
        return meta

    def put(self, name: str, data: bytes) -> bool:
        """Store the single file ``name``; False if no tier took it (warned)."""
        return self.store.set_record(self._file_key(name), data, self._member_meta(name))

    def put_group(self, name: str, members: dict[str, bytes], compile_seconds: float | None = None) -> bool:
        """Store the group as one record (``compile_seconds``: what a hit on it saves, as
        ``stats`` counts it). Race: two writers of one key each store a whole group; the
        last one stays, and a reader gets one or the other, never a mix."""
        payload, sizes = pack(members)
        return self.store.set_record(self._group_key(name), payload, self._group_meta(members, sizes, compile_seconds))

    def get_group(self, name: str) -> dict[str, bytes] | None:
        """Every member of the group, from one record that passed its tier's check; else None."""
        record = self.store.get_record(self._group_key(name))
        if record is None:
            return None
        saved = record[1].get("compile_seconds") if isinstance(record[1], dict) else None
        self.saved_seconds = float(saved) if isinstance(saved, (int, float)) else 0.0
        members = unpack(record[0], record[1], is_plain)
        if members is None:
            # Written by another writer (any host sharing an unsigned store), or another
            # format under this key: a member named "../x" would make Triton's own file
            # manager (RemoteCacheManager) write outside its directory. A miss.
            warn_once("group-format", f"group {name!r} is not a packed group of plain file names; a miss")
        return members

    def _group_key(self, name: str) -> bytes:
        return _GROUP_DOMAIN + self._prefix + name.encode("utf-8")

    def lead_or_wait(self, name: str) -> tuple[Any, dict[str, bytes] | None]:
        """After a miss of group ``name``: single flight across threads, processes and hosts
        (compile.flight.SingleFlight, as compile_program's): (a held flight, None) when this
        caller is to compile it (release it with ``release`` once the group is stored, or when
        the compile failed), or (None, the members) when a peer published them meanwhile, or
        (None, None) when the wait ran out or this process already compiles it (then compile
        without the lock: a second compile, never a wrong kernel)."""
        key = hashlib.sha256(self._group_key(name)).digest()
        if key in _held:
            return None, None  # this process compiles it already (Triton asking again): no self-wait
        flight = SingleFlight.for_store(self.store, key)

        def ready() -> bool:  # asked by the flight after each lock it takes
            return self.store.get_record(self._group_key(name), internal=True) is not None

        hold = flight.hold(ready)
        outcome = hold.__enter__()
        if outcome == ACQUIRED:
            _held.add(key)
            return (hold, flight.lock_path, key), None
        release((hold, flight.lock_path, None))
        if outcome != READY:
            return None, None
        record = self.store.get_record(self._group_key(name), internal=True)  # the miss was counted
        return None, None if record is None else unpack(record[0], record[1], is_plain)


# The flights this process holds (their keys): a second ask of a key it compiles must not wait on itself.
_held: set[bytes] = set()


def _forget_held() -> None:
    _held.clear()  # a forked child holds none of its parent's locks (forksafe resets those)


forksafe.reset_function_in_child(_forget_held)


def release(held: Any) -> None:
    """Let a flight from ``lead_or_wait`` go (the peers waiting for it read the store now), and
    remove its lock file if no peer holds it: a kernel leaves no lock file behind at rest."""
    hold, lock_path, key = held
    _held.discard(key)
    with contextlib.suppress(Exception):  # a release must never fail the caller (it may run at exit)
        hold.__exit__(None, None, None)
    if lock_path is not None:
        with contextlib.suppress(OSError):
            lockfiles.remove_if_idle(lock_path)


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
