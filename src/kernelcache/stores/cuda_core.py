"""cuda.core's program caches and kernelcache's, both directions, in one place.

kernelcache -> cuda.core: every kernelcache store is a ``cuda.core.utils.ProgramCacheResource``
(``Program.compile(cache=store)`` checks exactly that). kernelcache's ABC is *registered*
as a virtual subclass of cuda.core's instead of inheriting from it, because importing
cuda.core costs 0.5-1 s and the CLI's ``stats``/``ls`` must not pay it: the registration
happens when cuda.core's ABC is imported (at once if it already is). ``import cuda.core``
imports it, so it is in place before any ``Program`` exists. The registration runs when
this module is imported, which ``kernelcache.stores`` does first thing.

cuda.core -> kernelcache: ``compile_program`` accepts cuda.core's stores (and any other
cuda.core ProgramCacheResource), wrapped by ``as_store`` in a ``ForeignStore``: payloads go
to the store as they are (cuda.core's Program.compile reads them), and single flight uses a
file lock beside the store's directory when it has one. Such a store keeps bytes only, so
``ForeignStore`` keeps the metadata (compile log, symbol mapping...) as a second entry
under a derived key: a domain prefix no key made by kernelcache starts with, 18 bytes longer
than the key it belongs to (so it never equals a 32-byte key), holding the payload's
SHA-256, which is checked on every hit: a payload without its record, or with another
payload's record, is a miss, never a wrong kernel. (A user's own ProgramCacheResource
subclass keeps its metadata the same way: ``read_record``/``write_record``.)
"""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from kernelcache.memo import is_instance
from kernelcache.stores.base import Meta, ProgramCacheResource, ValueLike, as_key_bytes, as_value_bytes

_ABC_MODULE = "cuda.core.utils._program_cache._abc"
META_PREFIX = b"\x00kernelcache-meta\x00"

_lock = threading.Lock()
_to_register: list[type] = []
_finder_installed = False


def register_with_cuda_core(cls: type) -> None:
    """Make ``cls`` (and its subclasses) count as a cuda.core ProgramCacheResource."""
    global _finder_installed
    with _lock:
        _to_register.append(cls)
        module = sys.modules.get(_ABC_MODULE)
        if module is not None:
            _register_all(module)
        elif not _finder_installed:
            _finder_installed = True
            sys.meta_path.insert(0, _RegisterWhenImported())


def _register_all(module: Any) -> None:
    base = getattr(module, "ProgramCacheResource", None)
    if base is None:  # a cuda.core without a program cache: nothing to join
        return
    for cls in _to_register:
        base.register(cls)


class _RegisterWhenImported(importlib.abc.MetaPathFinder):
    """Runs the registration right after cuda.core's ABC module executes, then steps aside."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if fullname != _ABC_MODULE:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            if getattr(module, "__name__", None) == _ABC_MODULE:
                with _lock:
                    _register_all(module)

        loader.exec_module = exec_module  # this module's own loader instance
        return spec


def cuda_core_resource_type() -> type | None:
    """cuda.core's ProgramCacheResource if cuda.core is imported, else None (no import here)."""
    module = sys.modules.get(_ABC_MODULE)
    return getattr(module, "ProgramCacheResource", None) if module is not None else None


def meta_key(key: bytes) -> bytes:
    """The derived key of key's metadata record."""
    return META_PREFIX + key


def read_record(store: Any, key: bytes) -> tuple[bytes, dict[str, Any]] | None:
    """(payload, meta) from a store that keeps bytes only; None unless both match."""
    payload = store.get(key)
    if payload is None:
        return None
    raw = store.get(meta_key(key))
    if raw is None:
        return None
    try:
        record = json.loads(bytes(raw))
        meta, digest = record["meta"], record["payload_sha256"]
    except (ValueError, TypeError, KeyError):
        return None
    payload = bytes(payload)
    if not isinstance(meta, dict) or digest != hashlib.sha256(payload).hexdigest():
        return None
    return payload, meta


def write_record(store: Any, key: bytes, payload: bytes, meta: dict[str, Any]) -> None:
    """Store the metadata record, then the payload.

    Record first: a reader that finds the payload finds its record already there, and a
    crash between the two leaves only a record without payload (a miss).
    """
    record = {"payload_sha256": hashlib.sha256(payload).hexdigest(), "meta": meta}
    store[meta_key(key)] = json.dumps(record, sort_keys=True).encode()
    store[key] = payload


def store_directory(store: Any) -> str | None:
    """The directory of a file-backed foreign store (cuda.core's FileStreamProgramCache)."""
    root = getattr(store, "_root", None)  # cuda.core 1.2's FileStreamProgramCache
    if root is None:
        return None
    root = os.fspath(root)
    return root if os.path.isdir(root) else None


class ForeignStore(ProgramCacheResource):
    """Wraps a cuda.core ProgramCacheResource; the wrapped store is not closed by close()."""

    def __init__(self, store: Any) -> None:
        self.store = store
        directory = store_directory(store)
        # Beside cuda.core's entries/ and tmp/, which are all its scans and clear() touch.
        self._locks = os.path.join(directory, "kernelcache-locks") if directory else None

    def __getitem__(self, key: bytes | str) -> bytes:
        return bytes(self.store[as_key_bytes(key)])

    def __setitem__(self, key: bytes | str, value: ValueLike) -> None:
        self.store[as_key_bytes(key)] = as_value_bytes(value)

    def __delitem__(self, key: bytes | str) -> None:
        k = as_key_bytes(key)
        try:
            del self.store[meta_key(k)]
        except KeyError:
            pass
        del self.store[k]

    def __len__(self) -> int:
        return len(self.store)

    def clear(self) -> None:
        self.store.clear()

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        value = self.store.get(as_key_bytes(key))
        return default if value is None else bytes(value)

    def get_record(self, key: bytes | str, *, internal: bool = False) -> tuple[bytes, Meta] | None:
        return read_record(self.store, as_key_bytes(key))

    def set_record(
        self, key: bytes | str, payload: ValueLike, meta: Meta | None = None, *, internal: bool = False
    ) -> bool:
        write_record(self.store, as_key_bytes(key), as_value_bytes(payload), dict(meta or {}))
        return True

    def lock_path(self, name: str) -> str | None:
        """A lock file for single flight across processes sharing the store's directory."""
        if self._locks is None:
            return None  # no directory: single flight stays in-process
        os.makedirs(self._locks, mode=0o700, exist_ok=True)
        return os.path.join(self._locks, name)


def as_store(cache: object, what: str = "cache") -> ProgramCacheResource:
    """``cache`` as a kernelcache store: ours as it is, a cuda.core one wrapped; else TypeError."""
    if is_instance(cache, ProgramCacheResource):
        return cache
    foreign = cuda_core_resource_type()
    if foreign is not None and isinstance(cache, foreign):
        return ForeignStore(cache)
    raise TypeError(
        f"{what} must be a ProgramCacheResource (kernelcache's or cuda.core.utils') or None, not {type(cache).__name__}"
    )


# Every kernelcache store, user subclasses included, is a cuda.core.utils.ProgramCacheResource
# (Program.compile(cache=...) accepts it), without importing cuda.core here.
register_with_cuda_core(ProgramCacheResource)
