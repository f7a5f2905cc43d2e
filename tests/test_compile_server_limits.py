"""The compile server where workers cannot start in it (a limit it inherited, a host short of
processes or files): never a failed compile; the process starts its workers itself, with one
warning that says why. Real servers, real kills, real child processes."""

from __future__ import annotations

import os
import signal
import threading

import pytest
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
