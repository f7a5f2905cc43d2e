"""ForeignStore: a cuda.core ProgramCacheResource (bytes only) seen as a kernelcache store.

compile_program, KernelCache and TieredProgramCache accept cuda.core's own stores through
this adapter: payloads go to the store as they are (cuda.core's Program.compile reads
them), metadata goes under a derived key with the payload's digest (see interop.py), and
single flight uses a file lock beside the store's directory when it has one.
"""

from __future__ import annotations

import os
from typing import Any

from kernelcache.stores import interop
from kernelcache.stores.base import Meta, ProgramCacheResource, ValueLike, as_key_bytes, as_value_bytes


class ForeignStore(ProgramCacheResource):
    """Wraps a cuda.core ProgramCacheResource; the wrapped store is not closed by close()."""

    def __init__(self, store: Any) -> None:
        self.store = store
        directory = interop.store_directory(store)
        # Beside cuda.core's entries/ and tmp/, which are all its scans and clear() touch.
        self._locks = os.path.join(directory, "kernelcache-locks") if directory else None

    def __getitem__(self, key: bytes | str) -> bytes:
        return bytes(self.store[as_key_bytes(key)])

    def __setitem__(self, key: bytes | str, value: ValueLike) -> None:
        self.store[as_key_bytes(key)] = as_value_bytes(value)

    def __delitem__(self, key: bytes | str) -> None:
        k = as_key_bytes(key)
        try:
            del self.store[interop.meta_key(k)]
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
        return interop.read_record(self.store, as_key_bytes(key))

    def set_record(
        self, key: bytes | str, payload: ValueLike, meta: Meta | None = None, *, internal: bool = False
    ) -> bool:
        interop.write_record(self.store, as_key_bytes(key), as_value_bytes(payload), dict(meta or {}))
        return True

    def lock_path(self, name: str) -> str | None:
        """A lock file for single flight across processes sharing the store's directory."""
        if self._locks is None:
            return None  # no directory: single flight stays in-process
        os.makedirs(self._locks, mode=0o700, exist_ok=True)
        return os.path.join(self._locks, name)


def as_store(cache: object, what: str = "cache") -> ProgramCacheResource:
    """``cache`` as a kernelcache store: ours as it is, a cuda.core one wrapped; else TypeError."""
    if isinstance(cache, ProgramCacheResource):
        return cache
    foreign = interop.cuda_core_resource_type()
    if foreign is not None and isinstance(cache, foreign):
        return ForeignStore(cache)
    raise TypeError(
        f"{what} must be a ProgramCacheResource (kernelcache's or cuda.core.utils') or None, not {type(cache).__name__}"
    )
