"""Counters every store keeps: hits, misses, stores, evictions, errors (by cause), bytes, compile savings.

Two implementations share one list of counter names (``COUNTERS``):

* :class:`MemoryStats` -- process-local, a dict under a lock.
* ``stores.file.counters.FileStats`` -- a small binary file of fixed 8-byte slots, updated
  under an ``fcntl`` record lock, so that any number of processes sharing one cache
  directory add up exactly (no lost updates, no per-process files to merge).

Both expose ``add(**deltas) -> dict``, ``set(name, value)`` and ``snapshot() -> dict``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal, get_args

from kernelcache import forksafe

# Why an error was counted: the closed set every counting site picks from. Each cause is a
# counter of its own (``errors_<cause>``); ``errors`` stays the total, added in the same update.
ErrorCause = Literal[
    "read", "write", "corrupt", "unverifiable", "unreachable", "refused", "remove", "too_large", "not_stored", "driver"
]
ERROR_CAUSES: dict[str, str] = {
    "read": "an entry could not be read (an I/O error, permissions, not a regular file)",
    "write": "an entry could not be written (disk full, a read-only file system, permissions)",
    "corrupt": "an entry failed its check (checksum, HMAC, truncated, damaged); a miss",
    "unverifiable": "a record signed with another secret, or not signed where one is required; left in place",
    "unreachable": "a remote tier was not reached (refused connection, timeout); skipped for a while",
    "refused": "a remote tier answered with an error (an error reply, an HTTP error, no such bucket)",
    "remove": "an entry could not be removed (evicting for the cap, a damaged entry, a discard)",
    "too_large": "an entry larger than the tier's cap; not stored there",
    "not_stored": "a compile was returned but not stored (a header changed during it, its trace was lost)",
    "driver": "the driver refused a cached artifact; it was evicted and compiled again",
}
# Errors counted without a cause (an earlier version, add_stats(errors=...) alone): a view only.
OTHER_CAUSE = "other"
assert tuple(ERROR_CAUSES) == get_args(ErrorCause)
CAUSE_COUNTERS = tuple(f"errors_{cause}" for cause in ERROR_CAUSES)

# The one list of counters. Slot order in the persistent file follows this tuple, so new
# counters are appended, never inserted (old files keep their meaning; see FileStats).
COUNTERS: tuple[str, ...] = (
    "hits",  # a look-up that returned bytes
    "misses",  # a look-up that found nothing usable (absent, corrupt, unreadable)
    "stores",  # artifacts written
    "evictions",  # entries removed to honour the size cap
    "errors",  # I/O or corruption problems that were degraded to a miss / dropped write
    "bytes_read",  # payload bytes returned by hits
    "bytes_written",  # payload bytes stored
    "compiles",  # compiler runs done through compile_program with this cache
    "compile_us_saved",  # microseconds of compile time that hits avoided
    "size_bytes",  # live bytes on disk (FileStats: the size-cap tracker)
    "reconciled_at",  # unix time of the last directory scan that reset size_bytes
    "internal_gets",  # look-ups made by kernelcache itself (header manifests): not user hits
    *CAUSE_COUNTERS,  # errors by cause (their sum is ``errors``)
    "copies_swept_at",  # unix time of the last sweep of idle copies handed to Triton (materialized.py)
)
SLOT_OF = {name: i for i, name in enumerate(COUNTERS)}  # a counter's slot in a counters file
# Not counters but the size tracker and its clocks: zeroing the statistics keeps them (the entries are still there).
TRACKER = ("size_bytes", "reconciled_at", "copies_swept_at")
ZEROABLE = tuple(name for name in COUNTERS if name not in TRACKER)


def check_names(deltas: Mapping[str, int]) -> None:
    """KeyError naming the unknown counters among ``deltas``."""
    unknown = set(deltas) - set(COUNTERS)
    if unknown:
        raise KeyError(f"unknown stats counter(s) {sorted(unknown)}; known: {COUNTERS}")


def error_deltas(cause: ErrorCause) -> dict[str, int]:
    """The counter deltas of one error of ``cause``: the total and the cause, counted together."""
    # Race: a reader between a count of the total and one of its cause would see an error
    # without a cause (``other``), and then lose it. One dict is one update: under the
    # counters file's lock (FileStats), under MemoryStats's lock, in one tally for Redis.
    if cause not in ERROR_CAUSES:
        raise ValueError(f"unknown error cause {cause!r}; known: {', '.join(ERROR_CAUSES)}")
    return {"errors": 1, f"errors_{cause}": 1}


def errors_view(raw: Mapping[Any, Any]) -> tuple[int, dict[str, int]]:
    """(errors, {cause: count} of the causes seen) from raw counters; the counts sum to errors.

    Errors counted without a cause are ``other``. A total below the causes' sum (a version
    that knew no causes zeroed the total, not them) is the sum: the figures stay consistent.
    """
    by_cause = {c: int(raw.get(f"errors_{c}", 0)) for c in ERROR_CAUSES}
    by_cause = {c: n for c, n in by_cause.items() if n > 0}
    seen = sum(by_cause.values())
    total = max(int(raw.get("errors", 0)), seen)
    if total > seen:
        by_cause[OTHER_CAUSE] = total - seen
    return total, by_cause


def public_view(raw: Mapping[str, int]) -> dict[str, Any]:
    """The counters a user reads: raw slots plus derived figures (hit rate, seconds saved,
    ``errors_by_cause``)."""
    out: dict[str, Any] = {name: int(raw.get(name, 0)) for name in COUNTERS if name not in CAUSE_COUNTERS}
    lookups = out["hits"] + out["misses"]
    out["hit_rate"] = (out["hits"] / lookups) if lookups else 0.0
    out["compile_seconds_saved"] = out.pop("compile_us_saved") / 1e6
    out["errors"], out["errors_by_cause"] = errors_view(raw)
    return out


class MemoryStats:
    """Process-local counters (thread-safe)."""

    persistent = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(COUNTERS, 0)
        forksafe.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A fresh lock (another thread of the parent may have held this one)."""
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> dict[str, int]:
        """Apply the deltas; return the counters as they are right after."""
        check_names(deltas)
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] = max(0, self._values[name] + delta)
            return dict(self._values)

    def set(self, name: str, value: int) -> None:
        check_names({name: value})
        with self._lock:
            self._values[name] = value

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    def zero(self) -> None:
        """Set every counter to 0, except the size tracker."""
        with self._lock:
            for name in ZEROABLE:
                self._values[name] = 0

    def add_deferred(self, **deltas: int) -> None:
        """The hot-path increment: no name check, no copy (names come from our own code)."""
        values = self._values
        with self._lock:
            for name, delta in deltas.items():
                values[name] += delta

    def close(self) -> None:
        pass


class TeeStats:
    """A store's own counters (``primary``: what its ``stats()`` shows; a Redis tier's fleet
    tally) and a second set every count is also added to (``also``: the tier's counters file in
    the local cache directory, stores.file.store.FileStreamProgramCache.tier_counters), so that
    ``kernelcache stats``, ``--json`` and Prometheus read every tier's counts from one place.
    What the primary offers besides (a fleet flush) is reached through it."""

    def __init__(self, primary: Any, also: Any) -> None:
        self._primary = primary
        self._also = also

    def __getattr__(self, name: str) -> Any:
        return getattr(self._primary, name)

    def add(self, **deltas: int) -> dict[str, int]:
        self._also.add_deferred(**deltas)  # never waits: written out with the next update or at exit
        return self._primary.add(**deltas)

    def add_deferred(self, **deltas: int) -> None:
        self._primary.add_deferred(**deltas)
        self._also.add_deferred(**deltas)

    def set(self, name: str, value: int) -> None:
        self._primary.set(name, value)

    def snapshot(self) -> dict[str, int]:
        return self._primary.snapshot()

    def zero(self) -> None:
        self._primary.zero()
        self._also.zero()

    def close(self) -> None:
        self._primary.close()
        self._also.close()
