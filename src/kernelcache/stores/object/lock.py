"""Single flight across hosts that share only a bucket: a lock object created only if absent.

The lock is the object ``<prefix>locks/<name>`` holding ``{"token", "expires"}``. Taking it
is a conditional create (If-None-Match), so exactly one host gets it. Its holder rewrites it
every third of the TTL, each time conditionally on the version it wrote last (If-Match);
a holder that dies stops rewriting, and once ``expires`` has passed a waiter replaces the
lock conditionally on the version it read, so two waiters cannot both take it over.

``expires`` is compared with each host's own clock: hosts whose clocks differ by more than
the TTL may both compile a key (a duplicate compile of identical bytes, never a wrong entry).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from kernelcache.stores import leases

DEFAULT_TTL_S = 10.0
_POLL_S = 0.1

# call(what, fn) runs fn(store) and returns its result, or None when the store failed.
Call = Callable[[str, Callable[[Any], Any]], Any]


def _body(token: str, ttl_s: float) -> bytes:
    return json.dumps({"token": token, "expires": time.time() + ttl_s}).encode()


def _create(path: str, body: bytes) -> Callable[[Any], Any]:
    """fn(store): the new lock's e_tag, or False when the lock exists."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    def run(store: Any) -> Any:
        try:
            return obstore.put(store, path, body, mode="create")["e_tag"] or False
        except (AlreadyExistsError, PreconditionError):
            return False

    return run


def _replace(path: str, body: bytes, e_tag: str) -> Callable[[Any], Any]:
    """fn(store): the e_tag of ``body`` written over version ``e_tag``, or False if that version is gone."""
    import obstore
    from obstore.exceptions import PreconditionError

    def run(store: Any) -> Any:
        try:
            return obstore.put(store, path, body, mode={"e_tag": e_tag})["e_tag"] or False
        except (PreconditionError, FileNotFoundError):
            return False

    return run


def _read(path: str) -> Callable[[Any], Any]:
    """fn(store): (e_tag, parsed lock) of the current lock, or False when there is none."""
    import obstore

    def run(store: Any) -> Any:
        try:
            got = obstore.get(store, path)
            raw = bytes(got.bytes())
        except FileNotFoundError:  # obstore's not-found
            return False
        try:
            held = json.loads(raw)
            float(held["expires"])
        except (ValueError, KeyError, TypeError):
            held = {"token": "", "expires": 0.0}  # unreadable: treated as expired
        return got.meta["e_tag"], held

    return run


def _take_over_expired(call: Call, path: str, body: bytes) -> Any:
    found = call("lock", _read(path))
    if not found:
        return found  # None (failed) or False (released meanwhile: the next create takes it)
    e_tag, held = found
    if float(held["expires"]) > time.time():
        return False
    # Race: two waiters may both see the same expired lock; the replacement is conditional
    # on the version read, so exactly one of them wins.
    return call("lock", _replace(path, body, e_tag))


@contextlib.contextmanager
def hold(call: Call, path: str, ttl_s: float, deadline: float, ready: Callable[[], bool]) -> Iterator[str]:
    """Yield "acquired", "ready" (a peer published the result), "timeout" or "unavailable"."""
    token = uuid.uuid4().hex

    def take() -> Any:
        body = _body(token, ttl_s)
        e_tag = call("lock", _create(path, body))
        return _take_over_expired(call, path, body) if e_tag is False else e_tag

    outcome, e_tag = leases.acquire_or_wait(take, ready, deadline, _POLL_S)
    if outcome != "acquired":
        yield outcome
        return

    def release() -> None:
        found = call("unlock", _read(path))
        # Race: between this read and the delete the lock changes hands only if it expired
        # (this holder stalled past the TTL); deleting the new holder's lock then costs at
        # most a duplicate compile of identical bytes.
        if found and found[1].get("token") == token:
            call("unlock", lambda store: _delete(store, path))

    with leases.refreshed(lambda stop: _refresh(call, path, token, ttl_s, e_tag, stop), release):
        yield "acquired"


def _delete(store: Any, path: str) -> bool:
    import obstore

    obstore.delete(store, path)
    return True


def _refresh(call: Call, path: str, token: str, ttl_s: float, e_tag: str, stop: threading.Event) -> None:
    # Each rewrite is conditional on the version this holder wrote last: a lock a peer took
    # over (this holder stalled past the TTL) is never revived.
    while not stop.wait(ttl_s / 3):
        e_tag = call("refresh lock", _replace(path, _body(token, ttl_s), e_tag))
        if not e_tag:
            return
