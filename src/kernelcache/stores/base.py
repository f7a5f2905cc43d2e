"""The store contract (ProgramCacheResource) and the coercions every store shares.

A store maps a key (bytes; str is UTF-8 encoded) to the compiled artifact's bytes, stored
verbatim. Built-in stores also keep a small metadata record per entry (content digest,
compile log, symbol mapping...); ``get_record``/``set_record`` expose it to kernelcache's
own layers. The mapping-style methods move the user-visible counters (hits, misses,
stores). Two other ways to read, each with one meaning: ``get_record(internal=True)`` is an
internal look-up (a header manifest, a tier promotion), counted apart as ``internal_gets``;
``RecordStore.get_record_uncounted`` touches no counter, for a caller that counts the hit or
miss itself (compile_program).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

from kernelcache import forksafe
from kernelcache.log import KernelCacheWarning as KernelCacheWarning  # re-exported: what stores warn with
from kernelcache.log import WarnOnce
from kernelcache.regular_file import read_regular
from kernelcache.stats import ErrorCause, MemoryStats, TeeStats, error_deltas, public_view
from kernelcache.stores import sniff

if TYPE_CHECKING:
    from cuda.core import ObjectCode

    ValueLike = Union[bytes, bytearray, memoryview, ObjectCode]
else:
    ValueLike = Union[bytes, bytearray, memoryview, Any]

Meta = dict[str, Any]


def as_key_bytes(key: object) -> bytes:
    """Return the key as bytes: bytes as they are, str as UTF-8; anything else is a TypeError."""
    if type(key) is bytes:
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes):  # a bytes subclass
        return bytes(key)
    raise TypeError(
        f"cache keys must be bytes or str, not {type(key).__name__}; "
        "use kernelcache.make_program_cache_key(...) to build one"
    )


def as_value_bytes(value: object) -> bytes:
    """Return the artifact bytes of ``value``.

    Accepts bytes, bytearray, memoryview (any contiguous buffer, copied), or a cuda.core
    ObjectCode; a path-backed ObjectCode is read now, at write time, so a later change of
    that file cannot change what the cache holds.
    """
    if type(value) is bytes:
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, memoryview):
        return value.tobytes()
    code = getattr(value, "code", None)
    if code is not None and type(value).__module__.startswith("cuda.core"):
        if isinstance(code, (bytes, bytearray, memoryview)):
            return bytes(code)
        if isinstance(code, str):  # ObjectCode.from_cubin("path/to/file.cubin")
            try:  # a FIFO at that path is refused, never waited on (regular_file.py)
                return read_regular(code)
            except FileNotFoundError:
                missing = f"cannot store path-backed ObjectCode in cache: {code} no longer exists"
                raise FileNotFoundError(missing) from None
    raise TypeError(
        "cache values must be bytes-like or ObjectCode (bytes, bytearray, memoryview or a cuda.core "
        f"ObjectCode), not {type(value).__name__}"
    )


def check_max_size(max_size_bytes: object) -> int | None:
    """Validate a size cap argument: None (no cap) or a positive int."""
    if max_size_bytes is None:
        return None
    if isinstance(max_size_bytes, bool) or not isinstance(max_size_bytes, int):
        raise TypeError(f"max_size_bytes must be an int or None, not {type(max_size_bytes).__name__}")
    if max_size_bytes <= 0:
        raise ValueError(f"max_size_bytes must be a positive number of bytes or None for no cap, got {max_size_bytes}")
    return max_size_bytes


class ProgramCacheResource(abc.ABC):
    """A byte store for compiled programs: bytes in, the same bytes out.

    Keys are bytes or str (``"k"`` and ``b"k"`` name the same entry); other key types raise
    TypeError. Values are bytes, bytearray, memoryview or a cuda.core ObjectCode.

    There is deliberately no ``__contains__``: ``if key in cache: cache[key]`` is racy when
    other threads or processes evict or replace entries between the two calls. Use
    ``get(key)``, which answers both questions in one step.

    Every store works as a context manager and has ``close()``; ``stats()`` returns counters.
    """

    @abc.abstractmethod
    def __getitem__(self, key: bytes | str) -> bytes:
        """Return the bytes stored under ``key``; KeyError when there are none."""

    @abc.abstractmethod
    def __setitem__(self, key: bytes | str, value: ValueLike) -> None:
        """Store ``value`` under ``key`` (a failed write is dropped with a warning)."""

    @abc.abstractmethod
    def __delitem__(self, key: bytes | str) -> None:
        """Remove ``key``; KeyError when it is absent."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of entries."""

    @abc.abstractmethod
    def clear(self) -> None:
        """Remove every entry."""

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        """Return the bytes under ``key``, or ``default`` when there are none."""
        try:
            return self[key]
        except KeyError:
            return default

    def update(self, items: Mapping[Any, ValueLike] | Iterable[tuple[Any, ValueLike]], /) -> None:
        """Store every (key, value) of a mapping or of an iterable of pairs."""
        pairs = items.items() if isinstance(items, Mapping) else items
        for key, value in pairs:
            self[key] = value

    def stats(self) -> dict[str, Any]:
        """Counters of this store (hits, misses, stores, evictions, errors and errors_by_cause, bytes...)."""
        return {}

    # Records: payload + metadata. Stores that keep no metadata of their own (a user's
    # subclass, say) get it through a second entry under a domain-separated derived key,
    # with the payload's digest checked on every read (stores.cuda_core.read_record).
    def get_record(self, key: bytes | str, *, internal: bool = False) -> tuple[bytes, Meta] | None:
        """Return ``(payload, meta)`` or None: the payload and its record, whose digest matches.

        ``internal=True``: an internal look-up, counted as ``internal_gets`` (by stores that
        count), never as a user hit or miss.
        """
        from kernelcache.stores import cuda_core

        return cuda_core.read_record(self, as_key_bytes(key))

    def get_many(self, keys: Sequence[bytes | str], *, internal: bool = False) -> list[tuple[bytes, Meta] | None]:
        """``get_record`` of every key, in order; a remote store answers them in one round trip.

        Counted as that many look-ups (``internal`` as in get_record).
        """
        return [self.get_record(key, internal=internal) for key in keys]

    def set_record(
        self, key: bytes | str, payload: ValueLike, meta: Meta | None = None, *, internal: bool = False
    ) -> bool:
        """Store payload and metadata; return False when the write was dropped.

        ``internal`` writes (header manifests) do not count as user-visible stores.
        """
        from kernelcache.stores import cuda_core

        cuda_core.write_record(self, as_key_bytes(key), as_value_bytes(payload), dict(meta or {}))
        return True

    def discard(self, key: bytes | str) -> None:
        """Remove ``key`` if present (no error when absent)."""
        from kernelcache.stores.cuda_core import meta_key

        for k in (meta_key(as_key_bytes(key)), key):
            try:
                del self[k]
            except KeyError:
                pass

    # -- declared capabilities: what a layer above may use beyond the mapping ---------------
    # Every store states them here (the defaults: none of them), so callers never probe
    # for attributes; a tiered store answers for its tiers.

    @property
    def read_only(self) -> bool:
        """True: this store never writes or deletes (a tiered store skips it for writes and clear)."""
        return False

    @property
    def reads_renew(self) -> bool:
        """True: reading a record keeps it as long as rewriting it would (eviction by last read,
        no expiry from the write): a record read often is never dropped first. False (this
        default): only a write renews it (a TTL from the write, or an order nobody said)."""
        return False

    def lock_path(self, name: str) -> str | None:
        """The lock file ``name`` that this host's processes flock for single flight; None: no
        file locks (threads of one process still meet). OSError: locks/ cannot be made."""
        return None

    @property
    def has_remote_lock(self) -> bool:
        """True: ``remote_lock`` makes the hosts sharing this store meet for single flight."""
        return False

    def remote_lock(
        self, name: str, deadline: float, ready: Callable[[], bool], local_lock: str | None = None
    ) -> contextlib.AbstractContextManager[str]:
        """Hold lock ``name`` across hosts until ``deadline`` (time.monotonic): yields
        "acquired", "ready" (``ready()`` said a peer published the result), "timeout" or
        "unavailable" (no remote lock: this default). ``local_lock``: the file lock held."""
        return contextlib.nullcontext("unavailable")

    @property
    def tmp_dir(self) -> str | None:
        """A directory on this store's filesystem for scratch files (NVRTC's header trace);
        None: the system temp directory serves."""
        return None

    @property
    def file_root(self) -> str | None:
        """The root directory of this store's file tier (a root it accepted); None: none."""
        return None

    def add_stats(self, **deltas: int) -> None:  # noqa: B027 - optional hook
        """Count events seen by a layer above (compile_program's compiles and savings)."""

    def zero_stats(self) -> None:  # noqa: B027 - optional hook
        """Reset the counters to 0 (``kernelcache stats --zero``); sizes and entries are kept."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; the default has none."""

    def __enter__(self) -> ProgramCacheResource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class CountingStore(ProgramCacheResource):
    """Base of kernelcache's own stores: the mapping API over counted look-ups.

    Implement ``_counted_read`` (a look-up that moves the counters), ``get_record_uncounted``,
    ``set_record`` and ``_remove``; this class derives the mapping API from them, counts hits,
    misses and stores, and issues each kind of warning once per store.
    """

    def __init__(self) -> None:
        self._stats: Any = MemoryStats()
        self._warned = WarnOnce()
        forksafe.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """Called in a forked child: a store that owns locks replaces them here."""

    def count_into(self, counters: Any) -> None:
        """Also add every count of this store to ``counters`` (a tier's counters file in the local
        cache directory: the default cache does so for its memory, bundle, Redis and object-store
        tiers, which keep theirs in process memory otherwise)."""
        self._stats = TeeStats(self._stats, counters)

    @abc.abstractmethod
    def _counted_read(self, key: bytes, internal: bool) -> tuple[bytes, Meta] | None:
        """The record under key (None: absent or unusable), counted as get_record documents."""

    @abc.abstractmethod
    def get_record_uncounted(self, key: bytes) -> tuple[bytes, Meta] | None:
        """get_record touching no counter at all: for a caller that counts the hit or miss itself."""

    @abc.abstractmethod
    def _remove(self, key: bytes) -> bool:
        """Remove key; return whether it was present.

        A removal that fails for another reason than absence (permissions, an immutable
        file, I/O) raises OSError: "could not remove" must never read as "was not there".
        """

    def warn_once(self, cause: str, message: str, *, counted_as: ErrorCause) -> None:
        """Warn about ``cause`` the first time it happens in this store; count an error of
        ``counted_as`` (stats.ERROR_CAUSES) every time."""
        self._stats.add(**error_deltas(counted_as))
        self._warned.warn(cause, message, stacklevel=3, origin=type(self).__name__)

    def get_record(self, key: bytes | str, *, internal: bool = False) -> tuple[bytes, Meta] | None:
        return self._counted_read(as_key_bytes(key), internal)

    def _count_read(self, record: tuple[bytes, Meta] | None, internal: bool) -> None:
        """One look-up's counters: internal_gets, or a user hit (with its bytes) or miss."""
        if internal:
            self._stats.add_deferred(internal_gets=1)
        elif record is None:
            self._stats.add_deferred(misses=1)
        else:
            self._stats.add_deferred(hits=1, bytes_read=len(record[0]))

    def __getitem__(self, key: bytes | str) -> bytes:
        record = self._counted_read(as_key_bytes(key), False)
        if record is None:
            raise KeyError(key)
        return record[0]

    def get(self, key: bytes | str, default: bytes | None = None) -> bytes | None:
        record = self._counted_read(as_key_bytes(key), False)
        return default if record is None else record[0]

    def __setitem__(self, key: bytes | str, value: ValueLike) -> None:
        data = as_value_bytes(value)
        self.set_record(key, data, sniff.describe(value, data))  # what the bytes say, for `ls`

    def __delitem__(self, key: bytes | str) -> None:
        """Remove ``key``: KeyError when absent, OSError when present but not removable."""
        if not self._remove(as_key_bytes(key)):
            raise KeyError(key)

    def discard(self, key: bytes | str) -> None:
        """Remove ``key`` if present; a failed removal is a warning, never an exception."""
        try:
            self._remove(as_key_bytes(key))
        except OSError as exc:
            message = f"could not remove a cache entry: {exc}; it stays in the cache"
            self.warn_once(f"remove-{exc.errno}", message, counted_as="remove")

    def add_stats(self, **deltas: int) -> None:
        self._stats.add_deferred(**deltas)

    def zero_stats(self) -> None:
        self._stats.zero()

    def stats(self) -> dict[str, Any]:
        return public_view(self._stats.snapshot())


class RecordStore(CountingStore):
    """A store of one backend: implement ``_read``, ``_write``, ``_remove``.

    This class turns those three into CountingStore's look-ups and writes, doing the
    key/value coercion once.
    """

    @abc.abstractmethod
    def _read(self, key: bytes) -> tuple[bytes, Meta] | None:
        """Return the verified ``(payload, meta)`` for key, or None (absent or unusable)."""

    @abc.abstractmethod
    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        """Store payload and meta; return False if the write was dropped."""

    def get_many(self, keys: Sequence[bytes | str], *, internal: bool = False) -> list[tuple[bytes, Meta] | None]:
        records = self._read_many([as_key_bytes(key) for key in keys])
        for record in records:
            self._count_read(record, internal)
        return records

    def _read_many(self, keys: Sequence[bytes]) -> list[tuple[bytes, Meta] | None]:
        """``_read`` of every key; a remote store overrides it with one round trip."""
        return [self._read(key) for key in keys]

    def get_record_uncounted(self, key: bytes) -> tuple[bytes, Meta] | None:
        return self._read(key)

    def _check_writable(self, what: str) -> None:
        """PermissionError for a deletion asked of a read_only store (``what`` it does not do)."""
        if self.read_only:
            raise PermissionError(f"this {type(self).__name__} is read_only=True: it does not {what}")

    def _counted_read(self, key: bytes, internal: bool) -> tuple[bytes, Meta] | None:
        record = self._read(key)
        self._count_read(record, internal)
        return record

    def set_record(
        self, key: bytes | str, payload: ValueLike, meta: Meta | None = None, *, internal: bool = False
    ) -> bool:
        data = as_value_bytes(payload)
        written = self._write(as_key_bytes(key), data, dict(meta or {}))
        if written and not internal:
            self._stats.add_deferred(stores=1, bytes_written=len(data))
        return written
