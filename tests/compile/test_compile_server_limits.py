"""The compile server where the host is short of something or keeps what is left behind: workers
that cannot start in it (a limit it inherited, a host short of processes or files), an init that
reaps nothing (a container's app as PID 1), servers that exit or are killed while others start.
Never a failed compile, never a file or process left for good. Real servers, kills, namespaces."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from helpers import ARCH
from test_compile_server import child, wait_for
from test_compile_server import server_dir as server_dir  # the fixture: a runtime dir of the test's

from kernelcache.compile import server_link

pytestmark = pytest.mark.usefixtures("server_dir")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def test_a_server_whose_workers_cannot_start_costs_one_warning(tmp_path) -> None:
    first = child(str(tmp_path / "a"), 0, 2)  # starts the server; compiles on workers of its own
    path = first["socket"]
    server = wait_for(lambda: server_link.server_status(path))["pid"]
    if not os.path.exists(f"/proc/{server}/task/{server}/children"):
        pytest.skip("this kernel does not list a process's children in /proc")
    done = threading.Event()

    def kill_its_workers() -> None:  # each as it starts, before it is warm: as if none could start there
        while not done.is_set():
            for pid in _children(server):
                os.kill(pid, signal.SIGKILL)
            done.wait(0.001)

    killer = threading.Thread(target=kill_its_workers)
    killer.start()
    try:
        wait_for(lambda: server_link.server_status(path)["broken"], timeout=60)
        out = child(str(tmp_path / "b"), 10, 2)
    finally:
        done.set()
        killer.join()
    assert (out["socket"], out["adopted"], out["compiles"], len(out["pids"])) == (path, 0, 2, 2)
    said = [w for w in out["warnings"] if "compile server" in w]
    assert len(said) == 1 and "ended before it was ready" in said[0], out["warnings"]


PID1 = r"""
import json, os, sys, time
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile import server_link
from kernelcache.compile.workers import pool
root = sys.argv[1]
src = 'extern "C" __global__ void z{i}(float* a) {{ a[0] = {i}; }}\n'
def batch(n):
    compile_many([{"code": src.format(i=n * 10 + j), "options": ProgramOptions(arch="%s")} for j in range(2)],
                 cache=FileStreamProgramCache(f"{root}/{n}"), processes=True, max_workers=2)
def zombies():  # this namespace's processes that ended and that nobody reaped
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat.rsplit(") ", 1)[1].startswith("Z"):
            found.append(int(pid))
    return found
batch(0)  # starts the server (this process compiles on workers of its own)
pool().close()
deadline = time.monotonic() + 60
while not ((s := server_link.server_status()) and s["idle"] == s["target"]) and time.monotonic() < deadline:
    time.sleep(0.05)
server = s["pid"]
batch(1)  # on 2 of its workers, which this process keeps past the server's idle time
while os.path.exists(server_link.socket_path()) and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(1)
pool().close()  # the workers it handed over end now
time.sleep(2)
print(json.dumps({"pid": os.getpid(), "server": server, "adopted": pool().adopted, "zombies": zombies()}))
""" % ARCH  # noqa: UP031 - the kernel source has braces of its own


def test_in_a_container_whose_init_never_reaps_a_server_leaves_no_worker_unreaped(tmp_path) -> None:
    # `docker run image python app.py`: the app is PID 1 of its namespace, and every orphan of
    # the namespace becomes its child; it waits for none of them. A server (itself an orphan)
    # that exits before its workers leaves each of them to it, a zombie for the app's life.
    import json
    import subprocess
    import sys

    env = {**os.environ, "KERNELCACHE_COMPILE_SERVER_IDLE": "2"}
    argv = ["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c", PID1, str(tmp_path)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    except FileNotFoundError:
        pytest.skip("no unshare here")
    if out.returncode != 0 and "unshare" in out.stderr and "Operation not permitted" in out.stderr:
        pytest.skip("cannot make a PID namespace here (needs root)")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pid"] == 1 and result["adopted"] == 2
    assert result["zombies"] == [result["server"]]  # the server itself, an orphan: nothing of what it started


def _listeners(path: str) -> int:
    """Sockets bound to ``path`` (/proc/net/unix names each by the path it was bound to, even
    once that file is gone): with nobody connecting, the servers listening there."""
    with open("/proc/net/unix") as f:
        return sum(1 for line in f if line.rstrip().endswith(" " + path))


def test_a_server_that_exits_leaves_no_file_and_starts_racing_its_exit_make_one_server(tmp_path, monkeypatch) -> None:
    # Every environment (an install, an edited checkout, a PID namespace) names a server of its
    # own: one that left its lock file behind at exit left a file per environment, for good.
    # Race: a server that removes its lock file as it exits, while others start, must never
    # let two of them think they hold it (one on the removed file, one on a new one).
    from test_compile_server import alive

    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER_IDLE", "1")
    first = child(str(tmp_path / "a"), 0, 2)
    path = first["socket"]
    server = wait_for(lambda: server_link.server_status(path))["pid"]
    wait_for(lambda: not alive(server), timeout=30)
    assert os.listdir(os.path.dirname(path)) == []
    most = 0
    for _ in range(3):  # each round: a server, and starts racing its idle exit
        server_link._start_server(path)
        wait_for(lambda: server_link.server_status(path))
        for _ in range(12):
            server_link._start_server(path)
            most = max(most, _listeners(path))
            time.sleep(0.1)
        most = max(most, _listeners(path))
    assert most == 1
    stopped = [s for s in server_link.list_servers() if s[1]]
    assert len(stopped) == 1 and server_link.stop_server(path)
    wait_for(lambda: not os.path.exists(path) and _listeners(path) == 0, timeout=30)
    wait_for(lambda: os.listdir(os.path.dirname(path)) == [], timeout=10)


def test_the_files_of_a_killed_server_are_cleared_by_the_next_and_a_live_ones_are_not(tmp_path) -> None:
    # A PID namespace's end kills its processes, its server too: its socket and lock file stay.
    # The next server to start in the directory (any environment's) clears them; a live
    # server's, whose lock is held, it leaves alone.
    live = child(str(tmp_path / "a"), 0, 2)
    killed = child(str(tmp_path / "b"), 0, 2, CUDA_KERNELCACHE_TEST_VARIABLE="1")
    victim = wait_for(lambda: server_link.server_status(killed["socket"]))["pid"]
    wait_for(lambda: server_link.server_status(live["socket"]))
    os.kill(victim, signal.SIGKILL)
    folder = os.path.dirname(live["socket"])
    dead = {os.path.basename(killed["socket"]), os.path.basename(killed["socket"])[:-5] + ".lock"}
    wait_for(lambda: dead <= set(os.listdir(folder)) and not server_link.server_status(killed["socket"]))
    third = child(str(tmp_path / "c"), 0, 2, CUDA_KERNELCACHE_TEST_VARIABLE="2")  # starts a server of its own
    wait_for(lambda: server_link.server_status(third["socket"]))
    assert not dead & set(os.listdir(folder))
    assert server_link.server_status(live["socket"])["idle"] >= 0  # still there, still serving
    assert os.path.basename(live["socket"]) in os.listdir(folder)
