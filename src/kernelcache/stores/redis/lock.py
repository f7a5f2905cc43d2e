"""Single flight across hosts: a short-lived Redis lock, refreshed while its holder compiles.

The lock is ``<namespace>:lock:<name>``, taken with SET NX PX. Its value names the holder:
``<local id>:<random token>``, where the local id is a digest of this kernel's boot id
and of the (device, inode) of the file lock the holder took first (compile_program holds
the per-key file lock of its host around the Redis lock). Two holders share a local id
exactly when they hold the same flock object: same kernel, same lock file.

How a waiter learns that the holder is gone:
* on another host: by expiry. The TTL is short (5 s by default) and a refresher thread
  extends it while the holder works; a holder that dies stops refreshing.
* on this host: at once. A waiter that holds the file lock and finds the Redis lock held
  under its own local id knows that holder is not running any more (it took the Redis
  lock while holding this very file lock, which we now hold), so the waiter takes the
  lock over (compare-and-set on the dead holder's value) instead of waiting for expiry.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from kernelcache.stores import leases

DEFAULT_TTL_S = 5.0
_POLL_S = 0.05
_RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_REFRESH_LUA = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)
_TAKE_OVER_LUA = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) else return 0 end"
)
_NO_LOCAL = "-"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def local_id(lock_path: str | None) -> str:
    """The local id of a holder of the file lock at ``lock_path`` (``-``: no local lock)."""
    if lock_path is None:
        return _NO_LOCAL
    try:
        st = os.stat(lock_path)
    except OSError:
        return _NO_LOCAL
    return hashlib.sha256(f"{_boot_id()}:{st.st_dev}:{st.st_ino}".encode()).hexdigest()[:16]


Call = Callable[[str, Callable[[Any], Any]], Any]


@contextlib.contextmanager
def hold(
    call: Call, lock_key: str, ttl_ms: int, deadline: float, ready: Callable[[], bool], local_lock: str | None
) -> Iterator[str]:
    """Yield "acquired", "ready" (a peer published the result), "timeout" or "unavailable".

    ``call(what, fn)`` runs ``fn(client)`` and returns None when Redis failed.
    """
    mine = local_id(local_lock)
    token = f"{mine}:{uuid.uuid4().hex}"

    def take() -> bool | None:
        # bool(): redis-py answers None both for "NX: already set" and (via call) for a
        # failure; False now means "held by a peer", None "Redis unreachable".
        got = call("lock", lambda c: bool(c.set(lock_key, token, nx=True, px=ttl_ms)))
        if got is False and mine != _NO_LOCAL:
            got = bool(_take_over_dead_local_holder(call, lock_key, mine, token, ttl_ms))
        return got

    outcome, _ = leases.acquire_or_wait(take, ready, deadline, _POLL_S)
    if outcome != "acquired":
        yield outcome
        return
    with leases.refreshed(
        lambda stop: _refresh(call, lock_key, token, ttl_ms, stop),
        lambda: call("unlock", lambda c: c.eval(_RELEASE_LUA, 1, lock_key, token)),
    ):
        yield "acquired"


def _take_over_dead_local_holder(call: Call, lock_key: str, mine: str, token: str, ttl_ms: int) -> Any:
    held_by = call("lock", lambda c: c.get(lock_key))
    if not isinstance(held_by, bytes) or not held_by.decode(errors="replace").startswith(mine + ":"):
        return False
    # Race: the value we read may expire, or be taken by another host, before we act on
    # it; the compare-and-set replaces exactly the dead holder's value or nothing. The
    # holder cannot still be alive: compile_program releases the Redis lock before the
    # file lock, so a live holder of this file lock's Redis lock would still hold the
    # file lock that we hold now.
    return call("lock", lambda c: c.eval(_TAKE_OVER_LUA, 1, lock_key, held_by, token, ttl_ms))


def _refresh(call: Call, lock_key: str, token: str, ttl_ms: int, stop: threading.Event) -> None:
    # Race (refresh vs expiry): a refresh runs every third of the TTL, so two refreshes in a
    # row can be late before the lock expires. If the holder stalls longer than that (a
    # paused VM, a Redis timeout), another host takes the lock and compiles the same key
    # too: a duplicate compile of identical bytes, never a wrong entry. The refresh only
    # extends a lock that still holds our token, so it never revives a peer's lock.
    while not stop.wait(ttl_ms / 3000):
        call("refresh lock", lambda c: c.eval(_REFRESH_LUA, 1, lock_key, token, ttl_ms))
