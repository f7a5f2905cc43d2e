"""The compile server against processes, servers and workers that misbehave: processes that ask
and go away, stopped or killed servers, full queues, silent and flooding connections, workers
that die or stop while idle, forks mid-start, another uid's runtime directory, bad settings.
Real servers, real sockets, real child processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import in_forked_child
from test_compile_server import CHILD, alive, child, serving_here, wait_for
from test_compile_server import server_dir as server_dir  # the fixture: a runtime dir of the test's

from kernelcache.compile import server_link

pytestmark = pytest.mark.usefixtures("server_dir")


def _status(path: str) -> dict:
    return wait_for(lambda: server_link.server_status(path))


def test_processes_that_ask_and_go_away_leave_every_worker_to_one_taker(tmp_path) -> None:
    path = serving_here()
    first = server_link.adopt_worker()  # right after a hand-over the server has no idle worker
    assert first is not None
    server = _status(path)["pid"]
    for _ in range(4):  # each asks for a worker, then is gone before the server has one for it
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(b"worker\n")
    status = wait_for(lambda: (s := server_link.server_status(path)) and not s["starting"] and s["idle"] >= 4 and s)
    assert len(set(status["workers"])) == len(status["workers"]), status  # never the same worker twice
    taken = [server_link.adopt_worker() for _ in range(status["idle"] + 1)]
    try:
        assert all(taken) and len({w.pid for w in taken} | {first.pid}) == len(taken) + 1
        assert server_link.server_status(path)["pid"] == server  # still serving
    finally:
        for worker in [first, *(w for w in taken if w)]:
            worker.close()


def test_workers_started_for_processes_that_left_are_not_kept_idle(tmp_path) -> None:
    path = serving_here()  # target: 2 idle workers (the fixture's 2 CPUs)
    for _ in range(6):  # each asks, and is gone before its worker is warm
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(b"worker\n")
    started = wait_for(lambda: (s := server_link.server_status(path)) and len(s["workers"]) >= 6 and s)
    status = wait_for(lambda: (s := server_link.server_status(path)) and not s["starting"] and s["idle"] <= 2 and s)
    assert len(status["workers"]) == status["target"] == 2
    wait_for(lambda: not any(alive(pid) for pid in set(started["workers"]) - set(status["workers"])))


def test_a_stopped_server_whose_queue_is_full_never_hangs_a_process(tmp_path) -> None:
    started = child(str(tmp_path / "a"), 0, 2)
    path = started["socket"]
    server = _status(path)["pid"]
    os.kill(server, signal.SIGSTOP)
    try:
        # Processes that gave up on it: their connections stay in its queue until it accepts.
        queued = []
        while len(queued) < 1000:
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            try:
                sock.connect(path)
            except BlockingIOError:
                sock.close()
                break
            queued.append(sock)
        for sock in queued:
            sock.close()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path / "b"), "10", "2"], capture_output=True, text=True, timeout=60
        )
    finally:
        os.kill(server, signal.SIGCONT)
    assert out.returncode == 0, out.stderr

    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["adopted"], result["compiles"]) == (0, 2)
    assert len([w for w in result["warnings"] if "compile server not used from now on" in w]) == 1
    assert alive(server)


def test_clients_that_connect_and_send_nothing_do_not_hold_up_the_others(tmp_path) -> None:
    started = child(str(tmp_path / "a"), 0, 2)
    path = started["socket"]
    server = _status(path)["pid"]
    wait_for(lambda: server_link.server_status(path)["idle"] == 2)
    silent = []  # probes that connect and never ask: more of them than a process waits seconds for
    for _ in range(int(server_link._REPLY_S) + 4):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        silent.append(sock)
    try:
        out = child(str(tmp_path / "b"), 10, 2)
    finally:
        for sock in silent:
            sock.close()
    assert (out["adopted"], out["compiles"], out["warnings"]) == (2, 2, [])
    assert server_link.server_status(path)["pid"] == server


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0]


def test_a_worker_killed_while_idle_in_the_server_is_never_handed_over(tmp_path) -> None:
    path = serving_here()
    status = wait_for(lambda: (s := server_link.server_status(path)) and s["idle"] == 2 and not s["starting"] and s)
    os.kill(status["pid"], signal.SIGSTOP)
    try:
        wait_for(lambda: _state(status["pid"]) == "T")  # stopped before anything below reaches it
        asking = socket.socket(socket.AF_UNIX)  # a process asks; its idle workers die before it is answered
        asking.connect(path)
        asking.sendall(b"worker\n")
        for pid in status["workers"]:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: all(_state(pid) == "Z" for pid in status["workers"]))  # dead: their parent is stopped
    finally:
        os.kill(status["pid"], signal.SIGCONT)
    asking.settimeout(60)
    data, fds, _, _ = socket.recv_fds(asking, 4096, 3)
    for fd in fds:
        os.close(fd)
    asking.close()
    assert len(fds) == 3 and json.loads(data)["pid"] not in status["workers"]  # a live one, started for it
    assert server_link.server_status(path)["pid"] == status["pid"]  # and the server goes on


def test_workers_that_could_not_start_for_a_while_do_not_end_the_servers_use(tmp_path) -> None:
    # A checkout away for a moment (a deploy, a branch switch): workers started meanwhile die
    # before they are ready. Once it is back, the server hands out workers again.
    import shutil

    import kernelcache

    copy = tmp_path / "src"
    shutil.copytree(os.path.dirname(kernelcache.__file__), copy / "kernelcache")
    env = {"PYTHONPATH": str(copy)}
    first = child(str(tmp_path / "a"), 0, 2, **env)
    path = first["socket"]
    wait_for(lambda: server_link.server_status(path)["idle"] == 2)
    os.rename(copy / "kernelcache", copy / "away")
    try:
        for _ in range(2):  # take the warm ones; the next ones cannot import kernelcache
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(path)
                sock.sendall(b"worker\n")
                for fd in socket.recv_fds(sock, 4096, 3)[1]:
                    os.close(fd)
        wait_for(lambda: server_link.server_status(path)["broken"])
    finally:
        os.rename(copy / "away", copy / "kernelcache")
    wait_for(lambda: (s := server_link.server_status(path)) and not s["broken"] and s["idle"] == 2, timeout=60)
    assert child(str(tmp_path / "b"), 10, 2, **env)["adopted"] == 2


def test_a_flood_of_silent_connections_does_not_exhaust_the_servers_files(tmp_path) -> None:
    import resource

    def low_limit() -> None:  # the server inherits it (and its fingerprint says so)
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "a"), "0", "2"],
        capture_output=True, text=True, timeout=120, preexec_fn=low_limit,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    path = json.loads(out.stdout.strip().splitlines()[-1])["socket"]
    server = _status(path)["pid"]
    silent = []
    try:
        for _ in range(300):  # more than it may hold open
            sock = socket.socket(socket.AF_UNIX)
            sock.setblocking(False)
            try:
                sock.connect(path)
            except BlockingIOError:  # its queue is full: it is taking them in
                sock.close()
                time.sleep(0.01)
                continue
            silent.append(sock)
        assert server_link.server_status(path)["pid"] == server
    finally:
        for sock in silent:
            sock.close()


FORK_CHILD = r"""
import os, signal, sys, threading, time
from kernelcache.compile import server_link
starting = threading.Thread(target=server_link.adopt_worker)  # starts a server: it never comes up
starting.start()
while not server_link._start_lock.locked() and starting.is_alive():
    time.sleep(0.0001)
pid = os.fork()  # while that thread waits for it, holding the start's lock
if pid == 0:
    signal.alarm(30)  # a child that hangs ends here (SIGALRM), not with the test
    worker = server_link.adopt_worker()
    os._exit(0 if worker is None else 3)
starting.join()
_, status = os.waitpid(pid, 0)
print(status)
"""


def test_a_child_forked_while_a_server_starts_does_not_wait_forever(tmp_path) -> None:
    started = child(str(tmp_path / "a"), 0, 2)
    path = started["socket"]
    server = _status(path)["pid"]
    os.kill(server, signal.SIGSTOP)  # stuck, holding its lock; and its socket is gone (a tmp cleaner)
    os.unlink(path)
    try:
        out = subprocess.run([sys.executable, "-c", FORK_CHILD], capture_output=True, text=True, timeout=120)
    finally:
        os.kill(server, signal.SIGCONT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]  # the child went on without a server


def _queued(path: str) -> int:
    """Connections to the listener at ``path`` that it has not accepted (/proc/net/unix lists them under its name)."""
    with open("/proc/net/unix") as f:
        return sum(1 for line in f if line.rstrip().endswith(" " + path)) - 1


def test_a_server_killed_before_it_read_a_request_leaves_that_process_its_own_workers(tmp_path) -> None:
    started = child(str(tmp_path / "a"), 0, 2)
    path = started["socket"]
    server = _status(path)["pid"]
    os.kill(server, signal.SIGSTOP)
    wait_for(lambda: _state(server) == "T")
    asking = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "b"), "10", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _queued(path) >= 1)  # its request sits unread in the stopped server's queue
    finally:
        os.kill(server, signal.SIGKILL)  # the kernel resets that connection (ECONNRESET)
        os.kill(server, signal.SIGCONT)
    out, err = asking.communicate(timeout=120)
    assert asking.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # Workers it started, or a new server's: never none, never a warning.
    assert (result["compiles"], len(result["pids"]), result["warnings"]) == (2, 2, [])


def test_another_users_runtime_dir_is_left_to_that_user(tmp_path, monkeypatch) -> None:
    # sudo keeping the user's XDG_RUNTIME_DIR: root's servers must not move in there (the
    # user could neither use the directory root made nor remove it).
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two uids")
    import tempfile

    theirs = tempfile.mkdtemp(prefix="kcu", dir="/tmp")
    os.chown(theirs, 4242, 4242)
    monkeypatch.setenv("XDG_RUNTIME_DIR", theirs)
    mine = server_link.private_dir()
    assert mine is not None and not mine.startswith(theirs + "/") and os.listdir(theirs) == []

    def as_that_user() -> str | None:  # the user whose directory it is finds it usable
        os.setgid(4242)
        os.setuid(4242)
        return server_link.private_dir()

    theirs_used, code = in_forked_child(as_that_user)
    assert code == 0 and theirs_used == os.path.join(theirs, "kernelcache")


@pytest.mark.parametrize("name, value", [("KERNELCACHE_COMPILE_SERVER", "sometimes"),
                                         ("KERNELCACHE_COMPILE_SERVER_IDLE", "soon")])  # fmt: skip
def test_a_bad_server_setting_raises_and_names_itself(tmp_path, name, value) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "a"), "0", "2"],
        capture_output=True, text=True, env={**os.environ, name: value}, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0 and "ConfigError" in out.stderr and f"{name}=" in out.stderr, out.stdout


def test_an_idle_worker_that_is_stopped_ends_with_its_server(tmp_path) -> None:
    path = serving_here()
    status = wait_for(lambda: (s := server_link.server_status(path)) and s["idle"] == 2 and not s["starting"] and s)
    stopped = status["workers"][0]
    os.kill(stopped, signal.SIGSTOP)  # it cannot see its request pipe hang up
    try:
        assert server_link.stop_server(path)
        wait_for(lambda: not alive(status["pid"]))
        wait_for(lambda: not any(alive(pid) for pid in status["workers"]))  # none left behind, stopped or not
    finally:
        if alive(stopped):
            os.kill(stopped, signal.SIGKILL)


def _take_idle(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        sock.sendall(b"worker\n")
        for fd in socket.recv_fds(sock, 4096, 3)[1]:
            os.close(fd)  # the worker ends


def test_a_worker_stuck_in_its_start_does_not_keep_processes_waiting(tmp_path) -> None:
    path = child(str(tmp_path / "a"), 0, 2)["socket"]  # the server of the processes below
    for _ in range(20):  # catch one of the top-up's workers before it is warm
        status = wait_for(lambda: (s := server_link.server_status(path)) and s["idle"] == 2 and not s["starting"] and s)
        for _ in range(2):
            _take_idle(path)
        starting = wait_for(lambda: (s := server_link.server_status(path)) and s["starting"] and s, timeout=10)
        fresh = sorted(set(starting["workers"]) - set(status["workers"]))
        os.kill(fresh[0], signal.SIGSTOP)  # its start stops here: never warm
        wait_for(lambda: server_link.server_status(path)["idle"] >= 1)
        time.sleep(2)  # the other one is warm by now
        after = server_link.server_status(path)
        if (after["idle"], after["starting"]) == (1, 1):
            break
        os.kill(fresh[0], signal.SIGCONT)  # it was warm already: again
    else:
        pytest.skip("could not stop a worker during its start")
    try:
        time.sleep(6)  # it has been starting for longer than any start takes
        out = child(str(tmp_path / "b"), 10, 2)
    finally:
        os.kill(fresh[0], signal.SIGKILL)
    assert (out["adopted"], out["compiles"], out["warnings"]) == (2, 2, [])
