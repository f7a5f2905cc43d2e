"""GuardedCache: concurrency-safe find_or_build with per-device epochs, a clear generation, and leases.

Generic (no CUDA): KernelCache uses it for loaded modules, one instance per device.

The rules, and where each is enforced:
- ``build`` and ``destroy`` never run under the cache's lock (so either may call back into
  the cache); the lock only guards dictionaries and counters.
- One build per key at a time: the first caller of a missing key becomes its builder; the
  others wait on that build's Event and share its value or its exception.
- ``evict_device(d)`` bumps d's epoch, ``clear()`` bumps the generation. A build remembers
  both when it starts; if they moved by the time it finishes, its value is destroyed, not
  installed (DeviceDestroyedDuringBuild; CacheClearedDuringBuild when
  ``invalidated_by_clear``).
- A lease pins a value: clear/evict unlink it at once (new look-ups build a fresh one) but
  destroy it only when its last lease ends.

Every piece of shared state is read and written under ``self._lock`` (or published through
an Event), so nothing here relies on the GIL: free-threaded CPython (3.13t/3.14t) is fine.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")

__all__ = ["CacheClearedDuringBuild", "DeviceDestroyedDuringBuild", "GuardedCache"]


class DeviceDestroyedDuringBuild(RuntimeError):
    """evict_device(device_id) ran while this value was being built; the value was destroyed."""

    def __init__(self, device_id: object) -> None:
        super().__init__(f"device {device_id} was evicted while a value for it was being built; it was discarded")
        self.device_id = device_id


class CacheClearedDuringBuild(RuntimeError):
    """clear() ran while this value was being built (invalidated_by_clear=True); it was destroyed."""

    def __init__(self) -> None:
        super().__init__("the cache was cleared while this value was being built; it was discarded")


class _Entry(Generic[V]):
    __slots__ = ("value", "device_id", "leases", "unlinked", "destroyed")

    def __init__(self, value: V, device_id: object) -> None:
        self.value = value
        self.device_id = device_id
        self.leases = 0
        self.unlinked = False  # removed from the table by clear/evict
        self.destroyed = False  # destroy() was (or is being) called: never twice


class _Flight:
    """One build in progress; waiters block on ``done``."""

    __slots__ = ("done", "entry", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.entry: _Entry | None = None
        self.error: BaseException | None = None


class GuardedCache(Generic[V]):
    """find_or_build / lease over values that must be destroyed exactly once.

    ``destroy(value)`` is called once per built value: when clear/evict unlinks it (after
    its last lease, if leased), or when a build turned out stale. ``invalidated_by_clear``:
    a build in flight across a clear() is discarded (True) or installed (False).
    """

    def __init__(self, destroy: Callable[[V], object], *, invalidated_by_clear: bool = False) -> None:
        if not callable(destroy):
            raise TypeError(f"destroy must be callable, not {type(destroy).__name__}")
        self._destroy = destroy
        self._invalidated_by_clear = bool(invalidated_by_clear)
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry[V]] = {}
        self._flights: dict[Hashable, _Flight] = {}
        self._epochs: dict[object, int] = {}
        self._generation = 0

    # -- look-ups ---------------------------------------------------------------------

    def peek(self, key: Hashable) -> V | None:
        """The value for key if one is installed, else None (never builds, takes no lease).

        Lock-free on purpose: a single dict.get is atomic in CPython with the GIL and in the
        free-threaded build (dicts lock themselves there), and taking the shard lock here made
        threads that share a device convoy behind each other. The value may be unlinked by a
        concurrent clear/evict right after: the same contract as find_or_build without a lease.
        """
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    def find_or_build(self, key: Hashable, build: Callable[[], V], *, device_id: object = None) -> V:
        """The value for key, building it (once, whoever asks concurrently) if missing.

        Without a lease the caller must not use the value after a concurrent clear() or
        evict_device() could have destroyed it: that is the caller's job to arrange (or
        use ``lease``, which removes this obligation).
        """
        return self._acquire(key, build, device_id, lease=False).value

    @contextlib.contextmanager
    def lease(self, key: Hashable, build: Callable[[], V], *, device_id: object = None) -> Iterator[V]:
        """Yield the value for key, kept alive (not destroyed) until the block exits."""
        entry = self._acquire(key, build, device_id, lease=True)
        try:
            yield entry.value
        finally:
            self._release(entry)

    def _acquire(self, key: Hashable, build: Callable[[], V], device_id: object, lease: bool) -> _Entry[V]:
        while True:
            with self._lock:
                entry = self._entries.get(key)
                if entry is not None:
                    if lease:
                        entry.leases += 1
                    return entry
                flight = self._flights.get(key)
                if flight is None:
                    flight = self._flights[key] = _Flight()
                    epoch = self._epochs.get(device_id, 0)
                    generation = self._generation
                    owner = True
                else:
                    owner = False
            if owner:
                return self._build(key, build, device_id, lease, flight, epoch, generation)
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            with self._lock:
                entry = flight.entry
                # Race: between the builder's install and this wake-up, a clear/evict may have
                # unlinked the entry (and, with no lease held, destroyed it). Take a lease only
                # on a live entry; otherwise look up again, which builds a fresh value.
                if entry is not None and not entry.unlinked:
                    if lease:
                        entry.leases += 1
                    return entry

    def _build(
        self,
        key: Hashable,
        build: Callable[[], V],
        device_id: object,
        lease: bool,
        flight: _Flight,
        epoch: int,
        generation: int,
    ) -> _Entry[V]:
        try:
            value = build()  # outside the lock: builds of other keys proceed meanwhile
        except BaseException as exc:
            with self._lock:
                del self._flights[key]  # nothing cached: a later call builds again
                flight.error = exc
            flight.done.set()
            raise
        with self._lock:
            del self._flights[key]
            # Race: evict_device/clear ran while build() did. Their bump is visible here
            # because both they and we hold the lock; a stale value must not be installed.
            if device_id is not None and self._epochs.get(device_id, 0) != epoch:
                flight.error = DeviceDestroyedDuringBuild(device_id)
            elif self._invalidated_by_clear and self._generation != generation:
                flight.error = CacheClearedDuringBuild()
            else:
                entry = _Entry(value, device_id)
                entry.leases = 1 if lease else 0  # leased before anyone can unlink it
                self._entries[key] = entry
                flight.entry = entry
        flight.done.set()
        if flight.error is not None:
            try:
                self._destroy(value)
            except Exception:
                pass  # the discard's own exception explains more than destroy's
            raise flight.error
        return entry

    def _release(self, entry: _Entry[V]) -> None:
        with self._lock:
            entry.leases -= 1
            due = entry.leases == 0 and entry.unlinked and not entry.destroyed
            if due:
                entry.destroyed = True
        if due:
            try:
                self._destroy(entry.value)
            except Exception as exc:
                # The releasing caller did nothing wrong: report, do not raise into it.
                warnings.warn(f"kernelcache: deferred destroy failed: {exc!r}", RuntimeWarning, stacklevel=3)

    # -- invalidation -----------------------------------------------------------------

    def evict_device(self, device_id: object) -> None:
        """Unlink and destroy every value of ``device_id``; builds for it in flight are discarded."""
        with self._lock:
            self._epochs[device_id] = self._epochs.get(device_id, 0) + 1
            victims = [k for k, e in self._entries.items() if e.device_id == device_id and device_id is not None]
            doomed = self._unlink(victims)
        self._destroy_all(doomed)

    def clear(self) -> None:
        """Unlink and destroy every value (leased ones when their last lease ends)."""
        with self._lock:
            self._generation += 1
            doomed = self._unlink(list(self._entries))
        self._destroy_all(doomed)

    def _unlink(self, keys: list[Hashable]) -> list[V]:
        doomed = []
        for key in keys:
            entry = self._entries.pop(key)
            entry.unlinked = True
            if entry.leases == 0 and not entry.destroyed:
                entry.destroyed = True
                doomed.append(entry.value)
        return doomed

    def _destroy_all(self, values: list[V]) -> None:
        first: BaseException | None = None
        for value in values:  # every victim's destroy is attempted
            try:
                self._destroy(value)
            except Exception as exc:
                if first is None:
                    first = exc
        if first is not None:
            raise first

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        self.clear()

    def __enter__(self) -> GuardedCache[V]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
