"""What every cross-host single-flight lock does the same way: poll until the lock is taken, a
peer's result is ready, or the deadline passes; then hold it with a refresher thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


def acquire_or_wait(
    take: Callable[[], Any], ready: Callable[[], bool], deadline: float, poll_s: float
) -> tuple[str, Any]:
    """Poll ``take()`` (a truthy token: taken; falsy: held by a peer; None: the store failed).

    Returns ("acquired", token), ("unavailable", None), ("ready", None) once ``ready()`` is
    true, or ("timeout", None) at ``deadline`` (time.monotonic()).
    """
    while True:
        got = take()
        if got is None:
            return "unavailable", None
        if got:
            return "acquired", got
        if ready():
            return "ready", None
        if time.monotonic() >= deadline:
            return "timeout", None
        time.sleep(poll_s)


@contextlib.contextmanager
def refreshed(refresh: Callable[[threading.Event], None], release: Callable[[], Any]) -> Iterator[None]:
    """Run ``refresh(stop)`` on a daemon thread while the body runs, then stop it and ``release()``."""
    stop = threading.Event()
    refresher = threading.Thread(target=refresh, args=(stop,), daemon=True)
    refresher.start()
    try:
        yield
    finally:
        stop.set()
        refresher.join(timeout=5)
        release()
