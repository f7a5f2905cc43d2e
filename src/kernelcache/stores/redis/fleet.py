"""Fleet-wide counters kept in Redis itself: what every host sharing a namespace did.

One hash per namespace, ``<namespace>:stats``, with the fields of ``FLEET_COUNTERS``. Each
store adds its own counts to a local tally; one daemon thread per process (started with the
first tally) sends every store's tally with HINCRBY about once a second, and at close or
interpreter exit. A hit never makes a round trip, nor waits for one: a stalled server
stalls the sender thread only. A tally that cannot be sent (Redis down) is kept and sent
with the next flush. Read-only stores send nothing.
"""

from __future__ import annotations

import atexit
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from kernelcache import forksafe
from kernelcache.stats import CAUSE_COUNTERS, MemoryStats, errors_view

# Errors are kept by cause only: the fleet's total is their sum, so that a reader between two
# fields of one pipelined send never sees a total its causes do not add up to.
FLEET_COUNTERS = ("hits", "misses", "stores", "compiles", "compile_us_saved", *CAUSE_COUNTERS)
FLUSH_EVERY_S = 1.0
# Interpreter exit waits at most this long for the last flush: a stopped server (SIGSTOP,
# a dead host) must not hold up exit for a socket timeout the user set to minutes.
EXIT_WAIT_S = 2.0

_LIVE: weakref.WeakSet[FleetStats] = weakref.WeakSet()


class _Sender:
    """The one thread per process that sends the tallies of every live store."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.exiting = False
        self.done = threading.Event()

    def ensure_started(self) -> None:
        if self.thread is not None:
            return
        with self.lock:
            if self.thread is None and not self.exiting:
                thread = threading.Thread(target=self._run, name="kernelcache-fleet-counters", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # interpreter shutting down: the exit flush sends it
                    return
                self.thread = thread

    def _run(self) -> None:
        while True:
            self.wake.wait(FLUSH_EVERY_S)
            exiting = self.exiting
            for stats in list(_LIVE):
                try:
                    stats.flush()
                except Exception:  # pragma: no cover - a warning filter set to "error", say
                    pass  # counting must never end the thread that counts for every store
            if exiting:
                self.done.set()
                return

    def flush_at_exit(self) -> None:
        with self.lock:
            self.exiting = True
            thread = self.thread
        if thread is not None and thread.is_alive():
            self.wake.set()
            # Bounded: a sender stuck on a stopped server is abandoned (it is a daemon).
            self.done.wait(EXIT_WAIT_S)
            return
        for stats in list(_LIVE):  # no sender ever started here (nothing counted, or no threads)
            stats.flush()

    def reset_in_child(self) -> None:
        # fork() copies the calling thread only: the child has no sender, and locks held
        # by the parent's threads at the fork would stay held forever in the child.
        self.__init__()  # type: ignore[misc]


_SENDER = _Sender()


def on_sender_thread() -> bool:
    """Whether the caller is the process's counter-sending thread."""
    return _SENDER.thread is threading.current_thread()
atexit.register(_SENDER.flush_at_exit)


def _after_fork_in_child() -> None:
    _SENDER.reset_in_child()
    _counted_in.clear()  # the child is a process of its own
    for stats in list(_LIVE):
        stats._forget_parents_tally()


forksafe.reset_function_in_child(_after_fork_in_child)


def stats_key(namespace: str) -> str:
    return f"{namespace}:stats"


# The per-host breakdown: one hash per host (the same fields, plus "processes"), and a sorted
# set of host names scored by when each last sent. A host not seen for HOST_WINDOW_S drops out
# of the breakdown (its hash expires a day later), never out of the totals.
HOST_WINDOW_S = 86400.0
_counted_in: set[str] = set()  # namespaces this process has added itself to "processes" in


def _hosts_key(namespace: str) -> str:
    return f"{namespace}:stats:hosts"


def _host_key(namespace: str, host: str) -> str:
    return f"{namespace}:stats:host:{host}"


def send(client: Any, namespace: str, tally: dict[str, int]) -> bool:
    """Add ``tally`` to the namespace's totals and to this host's breakdown: one round trip."""
    host, now = socket.gethostname(), time.time()
    first = namespace not in _counted_in
    pipe = client.pipeline(transaction=False)
    for name, value in tally.items():
        pipe.hincrby(stats_key(namespace), name, value)
        pipe.hincrby(_host_key(namespace, host), name, value)
    if first:
        pipe.hincrby(_host_key(namespace, host), "processes", 1)
    pipe.expire(_host_key(namespace, host), int(2 * HOST_WINDOW_S))
    pipe.zadd(_hosts_key(namespace), {host: now})
    pipe.zremrangebyscore(_hosts_key(namespace), "-inf", now - HOST_WINDOW_S)
    pipe.execute()
    _counted_in.add(namespace)  # only once it was sent: a failed send is retried whole
    return True


def read_hosts(client: Any, namespace: str) -> dict[str, dict[str, Any]]:
    """{host: its counters, processes, last_seen} for the hosts seen within HOST_WINDOW_S."""
    seen = client.zrangebyscore(_hosts_key(namespace), time.time() - HOST_WINDOW_S, "+inf", withscores=True)
    out: dict[str, dict[str, Any]] = {}
    for raw_host, last_seen in seen:
        host = raw_host.decode(errors="replace") if isinstance(raw_host, bytes) else str(raw_host)
        raw = client.hgetall(_host_key(namespace, host))
        counters = view(raw)
        counters["processes"] = int(raw.get(b"processes", raw.get("processes", 0)))
        counters["last_seen"] = float(last_seen)
        out[host] = counters
    return out


def zero(client: Any, namespace: str) -> None:
    """Delete the namespace's totals and every host's breakdown (one key per call: a cluster's
    keys live on different nodes)."""
    for raw_host in client.zrange(_hosts_key(namespace), 0, -1):
        host = raw_host.decode(errors="replace") if isinstance(raw_host, bytes) else str(raw_host)
        client.delete(_host_key(namespace, host))
    client.delete(_hosts_key(namespace))
    client.delete(stats_key(namespace))


def view(raw: dict[Any, Any]) -> dict[str, Any]:
    """The fleet counters as ``kernelcache stats`` shows them (errors: their sum and by cause)."""
    values = {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}
    out: dict[str, Any] = {name: values.get(name, 0) for name in FLEET_COUNTERS if name not in CAUSE_COUNTERS}
    lookups = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / lookups if lookups else 0.0
    out["compile_seconds_saved"] = out.pop("compile_us_saved") / 1e6
    out["errors"], out["errors_by_cause"] = errors_view({k: v for k, v in values.items() if k in CAUSE_COUNTERS})
    return out


class FleetStats(MemoryStats):
    """This process's counters, plus a tally of the fleet counters bound for Redis.

    ``send(tally)`` writes the tally and returns False when it could not; ``send`` None
    (read_only) keeps the local counters only. Counting never calls ``send``: the process's
    sender thread does, about once a second, and ``flush()`` (close, fleet_stats) does.
    """

    def __init__(self, send: Callable[[dict[str, int]], bool] | None) -> None:
        super().__init__()
        self._send = send
        self._tally: dict[str, int] = {}
        self._tally_lock = threading.Lock()
        self._flushing = threading.Lock()
        if send is not None:
            _LIVE.add(self)

    def _note(self, deltas: dict[str, int]) -> None:
        if self._send is None:
            return
        with self._tally_lock:
            for name in FLEET_COUNTERS:
                if name in deltas:
                    self._tally[name] = self._tally.get(name, 0) + deltas[name]
        _SENDER.ensure_started()

    def add(self, **deltas: int) -> dict[str, int]:
        out = super().add(**deltas)
        self._note(deltas)
        return out

    def add_deferred(self, **deltas: int) -> None:
        super().add_deferred(**deltas)
        self._note(deltas)

    def flush(self) -> None:
        """Send the tally now (one pipelined round trip); keep it if Redis failed.

        Race: the sender thread and an explicit flush (close, fleet_stats) may run at once;
        the second waits for the first, so that a tally in flight has reached Redis before
        fleet_stats reads the counters back.
        """
        if self._send is None:
            return
        with self._flushing:
            with self._tally_lock:
                tally, self._tally = self._tally, {}
            tally = {k: v for k, v in tally.items() if v}
            if not tally:
                return
            sent = False
            try:
                sent = self._send(tally)
            finally:
                if not sent:  # also when send raised (a warning turned into an error)
                    with self._tally_lock:
                        for name, value in tally.items():
                            self._tally[name] = self._tally.get(name, 0) + value

    def drop_tally(self) -> None:
        """Forget the counts not yet sent (the fleet counters are being zeroed)."""
        with self._tally_lock:
            self._tally = {}

    def _forget_parents_tally(self) -> None:
        # In a forked child: the parent sends what it counted; sending it here too (at the
        # child's exit) would count it twice. The locks may have been held by a parent's
        # thread at the fork: new ones (the child has one thread).
        self._tally = {}
        self._tally_lock = threading.Lock()
        self._flushing = threading.Lock()

    def close(self) -> None:
        self.flush()
        _LIVE.discard(self)
