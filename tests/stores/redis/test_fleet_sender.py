"""Fleet counters leave the caller's thread (a hit never waits on Redis for them), exit
never hangs on a stopped server, and a forked child does not send its parent's tally.
Real redis-server processes, stopped with SIGSTOP; the round trips each thread makes are
observed with the interpreter's profiler (nothing of kernelcache or redis-py replaced)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator

import pytest
from redis_servers import RedisServer, need_redis

redis = pytest.importorskip("redis", reason="the redis client is the 'redis' extra: pip install -e '.[dev]'")
from kernelcache import RedisProgramCache  # noqa: E402 - needs the redis client checked above

REDIS_PKG = os.path.dirname(redis.__file__)


@pytest.fixture
def server(tmp_path):
    need_redis()
    s = RedisServer(str(tmp_path))
    yield s
    s.stop()


@pytest.fixture
def ns() -> str:
    return f"sender{time.time_ns()}"


@contextlib.contextmanager
def calls_on_this_thread(names: tuple[str, ...]) -> Iterator[list[str]]:
    """The redis-py functions among ``names`` that this thread entered meanwhile."""
    seen: list[str] = []

    def profile(frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        code = frame.f_code
        if event == "call" and code.co_name in names and code.co_filename.startswith(REDIS_PKG):
            seen.append(code.co_name)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def fleet_hits(url: str, ns: str) -> int:
    fleet = RedisProgramCache(url, namespace=ns, read_only=True).fleet_stats()
    assert fleet is not None
    return int(fleet["hits"])


def test_hits_send_no_counters_from_the_callers_thread(server, ns) -> None:
    """Before: about once a second a hit also sent the tally (HINCRBY) on the caller's thread."""
    rc = RedisProgramCache(server.url, namespace=ns)
    rc["k"] = b"v"
    n, until = 0, time.monotonic() + 2.5  # spans several flushes
    with calls_on_this_thread(("hincrby", "get")) as seen:
        while time.monotonic() < until or n < 50:
            assert rc.get("k") == b"v"
            n += 1
    assert seen.count("get") == n and seen.count("hincrby") == 0
    rc.close()
    assert fleet_hits(server.url, ns) == n  # the sender thread sent them, exactly


def test_stopped_server_costs_the_callers_thread_no_counter_round_trip(server, ns) -> None:
    """SIGSTOP'ed server: what compile_program reports after a hit (add_stats) for > 1 s
    makes no round trip on the caller's thread (before: one, which waited socket_timeout)."""
    rc = RedisProgramCache(server.url, namespace=ns, socket_timeout=1.0)
    rc["k"] = b"v"
    for _ in range(3):
        rc.get("k")  # a tally is pending
    server.pause()
    try:
        n, until = 0, time.monotonic() + 2.5
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the sender thread's "failed to count"
            with calls_on_this_thread(("send_packed_command", "send_command", "hincrby")) as seen:
                while time.monotonic() < until:
                    rc.add_stats(hits=1, compile_us_saved=10)
                    n += 1
                    time.sleep(0.01)
        assert seen == [] and n > 0
    finally:
        server.resume()


def test_exit_does_not_wait_for_a_stopped_server(server, ns) -> None:
    """A tally pending at exit, the server stopped, a socket timeout of 5 minutes: exit
    waits at most a short bound (before: the whole timeout)."""
    code = (
        "import sys; from kernelcache import RedisProgramCache as R\n"
        f"rc = R({server.url!r}, namespace={ns!r}, socket_timeout=300)\n"
        "rc['k'] = b'v'; rc.get('k')\n"
        "print('ready', flush=True); sys.stdin.readline()\n"
        "rc.add_stats(hits=1)\n"  # pending when the interpreter exits (no close)
    )
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        server.pause()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0  # a hang check, generous: the bound is seconds
    finally:
        server.resume()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_forked_child_does_not_send_its_parents_tally(server, ns) -> None:
    """Before: a child that exited normally sent the parent's unsent tally again."""
    code = (
        "import os, sys; from kernelcache import RedisProgramCache as R\n"
        f"rc = R({server.url!r}, namespace={ns!r})\n"
        "rc['k'] = b'v'\n"
        "[rc.get('k') for _ in range(5)]\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    [rc.get('k') for _ in range(2)]\n"
        "    sys.exit(0)\n"  # a normal exit: atexit handlers run in the child
        "_, status = os.waitpid(pid, 0)\n"
        "assert os.waitstatus_to_exitcode(status) == 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ), timeout=60)
    fleet = RedisProgramCache(server.url, namespace=ns, read_only=True).fleet_stats()
    assert fleet is not None and (fleet["hits"], fleet["stores"]) == (7, 1)


def test_sender_is_one_daemon_thread(server, ns) -> None:
    stores = [RedisProgramCache(server.url, namespace=f"{ns}{i}") for i in range(3)]
    for rc in stores:
        rc["k"] = b"v"
    senders = [t for t in threading.enumerate() if t.name == "kernelcache-fleet-counters"]
    assert len(senders) == 1 and senders[0].daemon
    for rc in stores:
        rc.close()


def test_sender_thread_failures_are_logged_not_warned_into_the_program(tmp_path, ns) -> None:
    """Warnings filters are process-wide: a "failed to count" raised on the sender thread
    landed in whatever the program ran meanwhile (a test counting its own warnings saw it)."""
    need_redis()
    s = RedisServer(str(tmp_path))
    rc = RedisProgramCache(s.url, namespace=ns)
    rc["k"] = b"v"  # a tally is pending
    s.kill()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        deadline = time.monotonic() + 60
        while rc.stats()["errors"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # the program does nothing with the store: only the sender fails
    assert rc.stats()["errors"] >= 1
    assert [str(w.message) for w in seen] == []
    rc.get("k")  # the program's own call warns as before
    assert rc.last_error
