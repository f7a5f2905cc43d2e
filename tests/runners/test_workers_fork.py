"""Forks of the caller while compile_many starts its compiler workers (another thread of the
caller forks: os.fork, multiprocessing's "fork" start method): real forks, real workers."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

from cuda.core import ProgramOptions
from helpers import ARCH, support_script
from sources import HEAVY, needs_bundled_headers

from kernelcache import CompileInfo, FileStreamProgramCache, compile_many, compile_program
from kernelcache.runners.pool import pool
from kernelcache.runners.slots import usable_cores

FORK_WRITER = support_script("_fork_writer.py")
KERNEL = 'extern "C" __global__ void f{n}(float* a) {{ a[threadIdx.x] *= {n}.5f; }}\n'


def _links(pid: int) -> dict[str, str]:
    """fd -> what it is open on, for process ``pid`` (an fd closed meanwhile is skipped)."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return out


def _our_fork(pid: int) -> bool:
    """``pid`` is still a forked child of ours (not a pid reused by a process started since)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f, open("/proc/self/cmdline", "rb") as mine:
            same = f.read() == mine.read()
    except FileNotFoundError:
        return False
    return fields[0] != "Z" and int(fields[1]) == os.getpid() and same


def _worker_pipes(pid: int) -> set[str]:
    """The request and reply pipes of worker ``pid`` (their fds are its last two arguments)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        fds = [arg.decode() for arg in f.read().split(b"\0") if arg][-2:]
    links = _links(pid)
    return {links[fd] for fd in fds}


def _read_exactly(fd: int, count: int, timeout: float) -> None:
    got, deadline = 0, time.monotonic() + timeout
    while got < count:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"only {got} of {count} forked children ran within {timeout} s"
        got += len(os.read(fd, count - got))


def test_a_fork_while_workers_start_neither_stalls_them_nor_keeps_their_pipes(tmp_path) -> None:
    pool().close()  # the batch below starts its workers, while the other thread forks
    children: list[int] = []
    stop, done = threading.Event(), threading.Event()
    stalled: list[bool] = []
    up_r, up_w = os.pipe()  # each child says it runs: its fork hooks are done by then

    def fork_helpers() -> None:  # long-lived forked children, as a fork-started process pool has
        while not stop.is_set() and len(children) < 60:
            pid = os.fork()
            if pid == 0:
                os.write(up_w, b"x")
                time.sleep(120)  # until the test kills it
                os._exit(0)
            children.append(pid)
            time.sleep(0.001)

    def watchdog() -> None:  # a start that waits for the children would wait 120 s: end it
        if not done.wait(60):
            stalled.append(True)
            for pid in list(children):
                os.kill(pid, signal.SIGKILL)

    threads = [threading.Thread(target=fork_helpers), threading.Thread(target=watchdog)]
    for thread in threads:
        thread.start()
    reqs = [{"code": KERNEL.format(n=n), "options": ProgramOptions(arch=ARCH)} for n in range(4)]
    try:
        objs = compile_many(reqs, cache=FileStreamProgramCache(tmp_path), processes=True, max_workers=4)
        stop.set()
        threads[0].join()  # no fork after this; and a child checked below has run its hooks:
        _read_exactly(up_r, len(children), timeout=60)
        # No forked child holds a pipe of a worker: a worker whose reply pipe a child can
        # write to never shows its death to us (no EOF), and one whose request pipe a child
        # holds open outlives us.
        pipes = set().union(*(_worker_pipes(pid) for pid in pool().pids()))
        held = {pid: set(_links(pid).values()) & pipes for pid in children if _our_fork(pid)}
    finally:
        stop.set()
        done.set()
        for thread in threads:
            thread.join()
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(up_r)
        os.close(up_w)
    assert not stalled, "a worker's start waited for a forked child to exit"
    assert len(objs) == 4  # (not in one assert with objs: pytest's repr of an ObjectCode list hangs here)
    assert len(pool().pids()) == min(4, usable_cores()) and children  # one per compile slot of the node's
    assert not {pid: p for pid, p in held.items() if p}


@needs_bundled_headers
def test_a_child_forked_during_a_compile_does_not_hold_the_key_from_its_waiters(tmp_path) -> None:
    """The child gets a copy of the fd holding the key's flock: only an explicit unlock, not
    our close, releases the lock while the child lives."""
    root = tmp_path / "c"
    heavy = {"code": HEAVY, "options": ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17")}
    compiling = threading.Thread(
        target=compile_many, args=([heavy],), kwargs={"cache": FileStreamProgramCache(root), "processes": True}
    )
    compiling.start()
    deadline = time.monotonic() + 60
    while not pool().pids(compiling=True) and time.monotonic() < deadline:
        time.sleep(0.001)
    worker = pool().pids(compiling=True)[0]
    os.kill(worker, signal.SIGSTOP)  # mid-compile, the key's locks held, until the waiter waits
    child = os.fork()
    if child == 0:
        time.sleep(120)  # a long-lived forked helper (until the test kills it)
        os._exit(0)
    info = CompileInfo()
    waiter = threading.Thread(
        target=compile_program,
        args=(heavy["code"],),
        kwargs={"options": heavy["options"], "cache": FileStreamProgramCache(root), "info": info, "wait_timeout": 60},
    )
    try:
        waiter.start()
        time.sleep(1)  # the waiter looks its miss up (milliseconds) while our compile is stopped
        os.kill(worker, signal.SIGCONT)
        compiling.join()
        waiter.join()
    finally:
        os.kill(worker, signal.SIGCONT)
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    # It waited for our compile and read its result, not the budget out and a compile of its own.
    assert info.waited and info.hit
    assert FileStreamProgramCache(root).stats()["compiles"] == 1


def test_children_forked_while_entries_are_written_hold_no_shard_lock(tmp_path) -> None:
    """A write holds its shard directory's flock for a few system calls; a child forked then
    kept it for its whole life, and every later write to that shard, by anyone, waited out
    the lock's bound and was dropped. A small process of its own writes and forks (each
    child checks its inherited shard locks and ends)."""
    out = subprocess.run(
        [sys.executable, FORK_WRITER, str(tmp_path / "c"), "3"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["forks"] > 50 and got["locked"] == 0
