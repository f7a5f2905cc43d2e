"""Fleet-wide counters kept in Redis itself: what every host sharing a namespace did.

One hash per namespace, ``<namespace>:stats``, with the fields of ``FLEET_COUNTERS``. Each
store adds its own counts to a local tally and sends the tally with HINCRBY at most once
a second (on the next counted event after that) and at close or interpreter exit: a
hit never costs a round trip of its own. A tally that cannot be sent (Redis down) is
kept and sent with the next flush. Read-only stores send nothing.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from kernelcache.stats import MemoryStats

FLEET_COUNTERS = ("hits", "misses", "stores", "compiles", "compile_us_saved")
FLUSH_EVERY_S = 1.0

_LIVE: weakref.WeakSet[FleetStats] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    for stats in list(_LIVE):
        stats.flush()


def stats_key(namespace: str) -> str:
    return f"{namespace}:stats"


def view(raw: dict[Any, Any]) -> dict[str, float | int]:
    """The fleet counters as ``kernelcache stats`` shows them."""
    values = {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}
    out: dict[str, float | int] = {name: values.get(name, 0) for name in FLEET_COUNTERS}
    lookups = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / lookups if lookups else 0.0
    out["compile_seconds_saved"] = out.pop("compile_us_saved") / 1e6
    return out


class FleetStats(MemoryStats):
    """This process's counters, plus a tally of the fleet counters bound for Redis.

    ``send(tally)`` writes the tally and returns False when it could not; ``send`` None
    (read_only) keeps the local counters only.
    """

    def __init__(self, send: Callable[[dict[str, int]], bool] | None) -> None:
        super().__init__()
        self._send = send
        self._tally: dict[str, int] = {}
        self._tally_lock = threading.Lock()
        self._flushing = threading.Lock()
        self._last = time.monotonic()
        if send is not None:
            _LIVE.add(self)

    def _note(self, deltas: dict[str, int]) -> None:
        if self._send is None:
            return
        with self._tally_lock:
            for name in FLEET_COUNTERS:
                if name in deltas:
                    self._tally[name] = self._tally.get(name, 0) + deltas[name]
            due = time.monotonic() - self._last >= FLUSH_EVERY_S
        if due:
            self.flush()

    def add(self, **deltas: int) -> dict[str, int]:
        out = super().add(**deltas)
        self._note(deltas)
        return out

    def add_deferred(self, **deltas: int) -> None:
        super().add_deferred(**deltas)
        self._note(deltas)

    def flush(self) -> None:
        """Send the tally now (one pipelined round trip); keep it if Redis failed."""
        if self._send is None or not self._flushing.acquire(blocking=False):
            return  # another thread is sending: its tally will carry ours next time
        try:
            with self._tally_lock:
                tally, self._tally = self._tally, {}
                self._last = time.monotonic()
            tally = {k: v for k, v in tally.items() if v}
            if tally and not self._send(tally):
                with self._tally_lock:
                    for name, value in tally.items():
                        self._tally[name] = self._tally.get(name, 0) + value
        finally:
            self._flushing.release()

    def drop_tally(self) -> None:
        """Forget the counts not yet sent (the fleet counters are being zeroed)."""
        with self._tally_lock:
            self._tally = {}

    def close(self) -> None:
        self.flush()
        _LIVE.discard(self)
