"""Store access that never fails a compile: a failing store is a miss or a dropped write.

Every store call of compile_program, the header manifests and the integrations goes through
here: an exception of any kind from a store (I/O, a server, corruption) becomes one warning
per (store class, action, error class), an error counted under its cause (``read`` or
``write``), and a miss or a dropped write.
"""

from __future__ import annotations

from typing import Any, Literal

from kernelcache.log import WarnOnce
from kernelcache.memo import is_instance
from kernelcache.stats import ErrorCause, error_deltas
from kernelcache.stores.base import CountingStore, Meta, ProgramCacheResource

_warned = WarnOnce()


def warn_store(cache: ProgramCacheResource, what: Literal["read", "write"], exc: BaseException) -> None:
    """Warn once per (store class, action, error class) and count an error of cause ``what``."""
    name = type(cache).__name__
    message = f"the cache {name} failed to {what} ({exc!r}); compiling without it"
    _warned.warn(f"{name}:{what}:{type(exc).__name__}", message, stacklevel=4)
    count_error(cache, what)


def read_record(cache: ProgramCacheResource, key: bytes, *, caller_counts: bool = False) -> tuple[bytes, Meta] | None:
    """A look-up that is never a user hit or miss in the store's counters.

    By default an internal look-up (``internal_gets``). ``caller_counts=True``: the caller
    counts this look-up as its own hit or miss, so the store counts nothing (a store that
    cannot skip counting counts it as internal).
    """
    try:
        if caller_counts and is_instance(cache, CountingStore):
            return cache.get_record_uncounted(key)
        return cache.get_record(key, internal=True)
    except Exception as exc:
        warn_store(cache, "read", exc)
        return None


def write_record(cache: ProgramCacheResource, key: bytes, payload: Any, meta: Meta, internal: bool = False) -> bool:
    """Store payload + metadata; whether it was written. A failure warns and is dropped (False);
    a read-only store is not written (False); a store that drops a write says so (too large)."""
    if cache.read_only:
        return False
    try:
        return cache.set_record(key, payload, meta, internal=internal) is not False
    except Exception as exc:
        warn_store(cache, "write", exc)
        return False


def count_error(cache: ProgramCacheResource, cause: ErrorCause) -> None:
    """Count one error of ``cause`` (stats.ERROR_CAUSES) in the store's counters."""
    count(cache, **error_deltas(cause))


def count(cache: ProgramCacheResource, **deltas: int) -> None:
    """Add to the store's counters; a store that cannot count is left alone."""
    try:
        cache.add_stats(**deltas)
    except Exception:
        pass
