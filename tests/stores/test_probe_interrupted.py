"""A remote-store probe interrupted by anything but the store's own error leaves the tier on.

After an outage one caller probes the store; a Ctrl-C in a notebook (KeyboardInterrupt) or
any other exception out of that probe must not leave the probe pending for good, which
skipped the store for the life of the process. Real redis-server, stopped with SIGSTOP; the
interrupt is a real signal (SIGALRM, whose handler raises KeyboardInterrupt) delivered while
the probe waits for the stopped server.
"""

from __future__ import annotations

import signal
import time

import pytest


def _interrupt(signum, frame):  # noqa: ANN001
    raise KeyboardInterrupt


def test_an_interrupted_redis_probe_leaves_the_tier_on(server) -> None:
    from kernelcache import KernelCacheWarning, RedisProgramCache

    namespace = f"probe{time.monotonic_ns()}"
    with RedisProgramCache(server.url, namespace=namespace) as writer:
        writer[b"k"] = b"v"
    # Read-only: no counters to send, so no thread of kernelcache's calls Redis meanwhile; every
    # call is the program's own.
    store = RedisProgramCache(server.url, namespace=namespace, socket_timeout=2.0, retry_after_s=0.2, read_only=True)
    assert store.get(b"k") == b"v"
    server.pause()  # SIGSTOP: connections are accepted, nothing answers
    try:
        with pytest.warns(KernelCacheWarning):
            assert store.get(b"k") is None  # the outage: a timeout, then a back-off
        time.sleep(0.3)  # the back-off is over: the next call is the one probe
        previous = signal.signal(signal.SIGALRM, _interrupt)
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # in the probe's wait for the stopped server
        try:
            with pytest.raises(KeyboardInterrupt):
                store.get(b"k")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    finally:
        server.resume()
    deadline = time.monotonic() + 10
    while store.get(b"k") != b"v":  # the next probe (due at once or after one back-off) reaches it
        assert time.monotonic() < deadline, f"the Redis tier stayed off: {store.stats()}"
        time.sleep(0.1)
    store.close()
