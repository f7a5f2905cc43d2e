"""Skip a remote store that cannot be reached: one failed call, then a back-off period.

A stopped server would otherwise cost a full timeout on every call of a compile (look-up,
lock, store). After one failure the store is skipped for ``retry_after_s``, doubling while
it stays down (up to five minutes); when the period ends, exactly one caller probes it.
A probe that ends in neither healthy() nor failed() (a KeyboardInterrupt, any exception that
is not the store's own error) is let go by ``settled()``, so the next caller probes again.
"""

from __future__ import annotations

import threading
import time

BACKOFF_CAP_S = 300.0


class Backoff:
    """The health of one remote store: may a call be made now, and what happened to the last."""

    def __init__(self, retry_after_s: float) -> None:
        self._retry_after = float(retry_after_s)
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._probing = False
        self._prober = 0  # the thread running the probe (threading.get_ident), while one runs
        self._pause = self._retry_after
        self.skipped = 0  # calls not made while backing off (not errors: nothing was tried)

    def may_call(self) -> bool:
        """Whether a call may be made now (False: backing off, count it as skipped)."""
        with self._lock:
            if not self._down_until:
                return True
            if time.monotonic() < self._down_until or self._probing:
                self.skipped += 1
                return False
            # Race: when the back-off ends, many threads may call at once; one of them probes
            # and the others keep skipping until it knows, so an outage costs one timeout per
            # back-off period, not one per thread.
            self._probing, self._prober = True, threading.get_ident()
            return True

    def settled(self) -> None:
        """After every call, in a ``finally``: a probe of this thread still pending (it raised
        something else than the store's error) is let go, without judging the store."""
        with self._lock:
            if self._probing and self._prober == threading.get_ident():
                self._probing = False

    def backing_off(self) -> bool:
        """Down and not yet due for a probe (a caller that should not even try, e.g. a counter flush)."""
        with self._lock:
            return bool(self._down_until) and (time.monotonic() < self._down_until or self._probing)

    def healthy(self) -> None:
        """The last call reached the store."""
        with self._lock:
            self._down_until = 0.0
            self._probing = False
            self._pause = self._retry_after

    def failed(self) -> float:
        """The last call did not reach the store: start (or lengthen) the back-off; return its seconds."""
        with self._lock:
            self._down_until = time.monotonic() + self._pause
            pause = self._pause
            self._pause = min(self._pause * 2, BACKOFF_CAP_S)
            self._probing = False
            return pause

    def down_now(self) -> bool:
        """Inside a back-off period right now (for stats)."""
        with self._lock:
            return bool(self._down_until and time.monotonic() < self._down_until)
