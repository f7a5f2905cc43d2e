"""One compiler worker process and the two pipes to it (the pool that uses them: workers.py).

A worker comes to this process one of two ways, and is used the same way after that:
- started here (``Worker.start``): ``python -c <boot> <sys.path> <in fd> <out fd>``, a child of
  this process (subprocess: fork + exec, so a caller holding a CUDA context is never forked);
- handed over by this node's compile server (``Worker.adopt``, server.py): a worker the server
  started earlier and warmed up, whose pipe ends and pidfd came over a Unix socket. It is the
  server's child, not ours: it is watched and killed through its pidfd, and its exit status is
  not ours to read.
Either way this process then holds the only writing end of its request pipe: the worker ends
when this process closes it or exits (worker_main._end_with_the_parent).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["FORK_LOCK", "Died", "Worker", "boot_flags", "environ_copy", "worker_argv"]

# The caller's sys.path first: the worker imports the very kernelcache and cuda packages it runs.
_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from kernelcache.compile.worker_main import main; main()"
)


def worker_argv(sys_path: list[str]) -> list[str]:
    """The command line of a worker that imports from ``sys_path`` (its two fds follow it)."""
    import json

    return [sys.executable, *boot_flags(), "-c", _BOOT, json.dumps(import_entries(sys_path))]


def import_entries(sys_path: list[Any]) -> list[str]:
    """The entries of ``sys_path`` that imports look in: str ones. A pathlib.Path appended to
    sys.path is skipped by imports, and must be here too (JSON has no such type: it kept every
    worker, and the compile server, from starting)."""
    return [p for p in sys_path if isinstance(p, str)]


def boot_flags() -> tuple[str, ...]:
    """``("-S",)`` when a worker finds kernelcache and cuda through the caller's sys.path alone,
    else ``()``. Computed once per process.

    A worker's start is on compile_many's critical path, and ``site`` is 41-46 ms of it on the
    hosts measured (.pth files that import hooks). The worker gets the caller's sys.path anyway,
    so it skips ``site`` unless a package it imports was found by something other than a plain
    path search (an editable install's import hook, a zipimport): then ``site`` runs there too.
    """
    global _BOOT_FLAGS
    if _BOOT_FLAGS is None:
        _BOOT_FLAGS = ("-S",) if all(_found_on_path(name) for name in ("kernelcache", "cuda")) else ()
    return _BOOT_FLAGS


def _found_on_path(name: str) -> bool:
    """A plain sys.path search finds the package this process imported as ``name``."""
    import importlib
    import importlib.machinery

    try:
        here = list(importlib.import_module(name).__path__)
        spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
    except Exception:
        return False
    return spec is not None and list(spec.submodule_search_locations or ()) == here


_BOOT_FLAGS: tuple[str, ...] | None = None


def package_dir() -> str:
    """The kernelcache package this process imported."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def hello(pid: int) -> tuple[str, int, str]:
    """What a worker says once its imports are done: ready, its pid, and the kernelcache it
    imported, which must be the one of whoever started it. A worker finds kernelcache through
    sys.path when it starts: a checkout moved or deleted since the caller imported its own
    leaves another copy found further down (an editable install's), whose code is not ours."""
    return ("ready", pid, package_dir())


def spawn(args: list[str], env: dict[str, str] | None) -> tuple[subprocess.Popen[bytes], Connection, Connection]:
    """Start the worker ``args`` names (worker_argv), its two pipe fds appended: (process, our
    end of its request pipe, our end of its reply pipe). Where other threads may fork, the
    caller holds FORK_LOCK (Worker.start says why); the server has no other threads."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    to, from_ = Connection(req_w, readable=False), Connection(rep_r, writable=False)
    try:
        proc = subprocess.Popen(
            [*args, str(req_r), str(rep_w)], pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, env=env
        )
    except BaseException:
        to.close()
        from_.close()
        raise
    finally:
        os.close(req_r)
        os.close(rep_w)
    return proc, to, from_


class Died(Exception):
    """The worker ended during an exchange (``started``: after it said it was ready;
    ``foreign``: it runs another kernelcache than ours, so no worker started now can be used)."""

    def __init__(self, started: bool, why: str, foreign: bool = False) -> None:
        super().__init__(why)
        self.started, self.foreign = started, foreign


class _Adopted:
    """The process side of a worker the compile server handed over: its pidfd, since it is
    not our child. The two methods of Popen the pool uses, with Popen's meaning."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd
        self.returncode: int | None = None

    def kill(self) -> None:
        import signal

        if self._pidfd >= 0:
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)  # never another process, even if its pid is reused

    def wait(self, timeout: float | None = None) -> int:
        """Wait until it ended; its status is the server's to reap: 0 here (TimeoutExpired after ``timeout``)."""
        import select

        if self._pidfd >= 0:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            if not poller.poll(None if timeout is None else int(timeout * 1000)):
                raise subprocess.TimeoutExpired("compiler worker", timeout or 0)
            os.close(self._pidfd)
            self._pidfd = -1
        self.returncode = 0
        return 0


class Worker:
    """One worker process and the two pipes to it (``start`` one or ``adopt`` one, never the constructor)."""

    def __init__(self, to: Connection, from_: Connection, proc: Any, started: bool) -> None:
        self._to, self._from, self.proc = to, from_, proc
        self.started = started  # it said "ready"
        self.adopted = isinstance(proc, _Adopted)
        self.compiling = False  # it said "ready" and has a compile to answer
        self.restrict = False  # it ran a restrict=True compile: NVRTC keeps --restrict on in it
        self._seq = 0

    @classmethod
    def start(cls) -> Worker:
        """A new worker, a child of this process (it says "ready" in answer to its first compile)."""
        # Race: a fork by another thread copies every fd we have. Mid-start, a child holding
        # subprocess's exec-status pipe keeps Popen waiting until it exits (a fork-started pool's:
        # for good); one holding the reply pipe hides this worker's death (no EOF); one holding the
        # request pipe outlives us with it. So a start runs under FORK_LOCK, which every fork
        # waits for, and the worker is in _LIVE before it is let go: a forked child closes copies.
        args = worker_argv(sys.path)
        with FORK_LOCK:
            proc, to, from_ = spawn(args, environ_copy())
            worker = cls(to, from_, proc, started=False)
            _LIVE.add(worker)
        return worker

    @classmethod
    def adopt(cls, req_w: int, rep_r: int, pid: int, pidfd: int) -> Worker:
        """A worker the compile server started and handed over (its fds now ours; the caller
        holds FORK_LOCK since receiving them, for the reason ``start`` gives)."""
        worker = cls(Connection(req_w, readable=False), Connection(rep_r, writable=False), _Adopted(pid, pidfd), True)
        _LIVE.add(worker)
        return worker

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def exchange(self, kind: str, args: bytes) -> tuple[Any, ...]:
        """Send one compile (its arguments pickled), return its reply ``(outcome, value,
        warnings)``; Died if the worker ended."""
        self._seq += 1
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None  # deleted: the worker compiles in a deleted directory too (worker_main)
        # Only builtins around the arguments: a worker can always read the sequence number,
        # and answers "unreadable" for arguments it cannot unpickle.
        message = (self._seq, kind, cwd, environ_copy(), list(sys.path), args)
        try:
            self._to.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
            if not self.started:
                said = pickle.loads(self._from.recv_bytes())
                if said != hello(self.pid):
                    foreign = isinstance(said, tuple) and said[:2] == ("ready", self.pid)
                    raise Died(False, f"compiler worker {self.pid} said {said!r}, not {hello(self.pid)!r}", foreign)
                self.started = True
            self.compiling = True
            # A whole message or EOFError: a worker killed while writing its reply leaves
            # nothing that could be taken for a result.
            reply = pickle.loads(self._from.recv_bytes())
        except (EOFError, OSError) as exc:
            raise Died(self.started, self._why_ended(exc)) from None
        finally:
            self.compiling = False
        if reply[0] != self._seq:
            raise Died(self.started, f"compiler worker {self.pid} answered #{reply[0]} for #{self._seq}")
        return reply[1:]  # type: ignore[no-any-return]

    def _why_ended(self, exc: BaseException) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return f"compiler worker {self.pid} stopped answering ({type(exc).__name__})"
        if self.adopted:
            return f"compiler worker {self.pid} (from the compile server) ended"
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f"compiler worker {self.pid} {how}"

    def close(self, kill: bool = False) -> None:
        """End the worker: closing its request pipe ends it; ``kill`` ends it now."""
        if kill:
            try:
                self.proc.kill()
            except OSError:
                pass
        with FORK_LOCK:  # a fork never copies a pipe half closed (see start)
            self._to.close()
            self._from.close()
            _LIVE.discard(self)
        try:
            self.proc.wait(timeout=None if kill else 5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def forget(self) -> None:
        """In a forked child: drop this process's copies of the pipes; the worker is the parent's."""
        ends: list[Any] = [self._to, self._from]
        for end in ends:
            try:
                end.close()
            except OSError:
                pass  # one end that cannot be closed must not keep the other, or other workers', open
        if isinstance(self.proc, _Adopted) and self.proc._pidfd >= 0:
            try:
                os.close(self.proc._pidfd)
            except OSError:
                pass


def environ_copy() -> dict[str, str]:
    """A copy of os.environ now. Race: a variable another thread removes while it is copied
    raises KeyError: copy again. Workers start with this copy, not the C library's ``environ``,
    which such a thread rewrites while the child execs (execve failed with EFAULT)."""
    while True:
        try:
            return dict(os.environ)
        except KeyError:
            continue


# Held while workers' pipes are made, received or closed, and by each fork; reentrant: a fork by its holder goes on.
FORK_LOCK = threading.RLock()
_LIVE: set[Worker] = set()  # every worker whose pipes this process holds open (the pool's or not)
_FORGOTTEN: list[Any] = []  # the parent's workers, in a forked child: never collected there


def _forget_in_child() -> None:
    global FORK_LOCK
    FORK_LOCK = threading.RLock()  # held by the forking thread, in the parent's copy
    for worker in list(_LIVE):
        worker.forget()
    _FORGOTTEN.append(list(_LIVE))
    _LIVE.clear()


# No worker starts, arrives or closes while a fork copies this process (Worker.start says why).
os.register_at_fork(
    before=lambda: FORK_LOCK.acquire(), after_in_parent=lambda: FORK_LOCK.release(), after_in_child=_forget_in_child
)
