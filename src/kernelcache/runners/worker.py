"""One compiler worker process and the two pipes to it (the pool that uses them: pool.py).

``python [-S] -c <boot> <sys.path> <libnvrtc> <idle s> <waiting> <request fd> <reply fd>``, a child
of this process (fork + exec: a caller holding a CUDA context is never forked into Python). Not
concurrent.futures or multiprocessing: their spawn and forkserver children re-import the caller's
``__main__`` (a script without a main guard starts itself again; one that imports torch pays that
per worker), their fork children copy the caller, CUDA context included. A worker gets the very
libnvrtc file this process runs (keys.toolchain.library_file), loads it before cuda.bindings looks
for one (cuda.pathfinder takes a library already loaded) and says which it mapped: one that mapped
another build is never used. It holds a compile slot for its life (slots.py), writes its stderr to
a file of ours (its last words go into the warning when it dies, never onto the terminal), and ends
when this process closes its pipe or exits, or idle (worker_main: it says "bye" first).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["FORK_LOCK", "IDLE_S", "Died", "Retired", "Worker", "boot_flags", "environ_copy"]

# An idle worker ends after this long (its slot goes back to the node; one another process waits
# for goes at once): a batch right after another finds its workers warm, an idle process holds
# none for long (an idle worker is ~90 MB, ~30 MB of it its own).
IDLE_S = 5.0
_BOOT = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from kernelcache.runners.worker_main import main; main()"
)


@functools.cache
def boot_flags() -> tuple[str, ...]:
    """``("-S",)`` when a worker finds kernelcache and cuda through the caller's sys.path alone,
    else ``()``. ``site`` is 41-46 ms of a worker's start on the hosts measured (.pth files that
    import hooks); a worker gets the caller's sys.path anyway, and its NVRTC by path (in a venv,
    -S leaves sys.prefix the base interpreter's, where cuda.pathfinder finds another libnvrtc or
    none). An editable install's import hook or a zipimport needs ``site``: it runs there too."""
    import importlib
    import importlib.machinery

    def found_on_path(name: str) -> bool:  # a plain sys.path search finds the package imported here
        try:
            here = list(importlib.import_module(name).__path__)
            spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
        except Exception:
            return False
        return spec is not None and list(spec.submodule_search_locations or ()) == here

    return ("-S",) if found_on_path("kernelcache") and found_on_path("cuda") else ()


def package_dir() -> str:
    """The kernelcache package this process imported (a worker must run the same one)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Died(Exception):
    """The worker ended during an exchange (``started``: after it said it was ready; ``foreign``:
    it runs another kernelcache or NVRTC than ours, so no worker started now can be used)."""

    def __init__(self, started: bool, why: str, foreign: bool = False) -> None:
        super().__init__(why)
        self.started, self.foreign = started, foreign


class Retired(Exception):
    """The worker ended by itself (idle) as this compile was sent: nothing ran, try another."""


class Worker:
    """One worker process and the two pipes to it (``start`` one, never the constructor)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], to: Connection, from_: Connection, errors: Any, nvrtc: tuple[str, str]
    ) -> None:
        self.proc, self._to, self._from, self._errors = proc, to, from_, errors
        self.nvrtc = nvrtc  # (the libnvrtc file it must map, that file's identity)
        self.started = False  # it said "ready", with our kernelcache and NVRTC
        self.compiling = False  # it has a compile to answer
        self.restrict = False  # it ran a restrict=True compile: NVRTC keeps --restrict on in it
        self._seq = 0

    @classmethod
    def start(cls, nvrtc: tuple[str, str], slot_fd: int, idle_s: float = IDLE_S) -> Worker:
        """A new worker, a child of this process, given the slot ``slot_fd`` (closed here, -1: none) and
        ``nvrtc``: (the libnvrtc file it must load, that file's identity). It says "ready" in
        answer to its first compile, and ends after ``idle_s`` without one."""
        # Race: a fork by another thread copies every fd we have. Mid-start, a child holding
        # subprocess's exec-status pipe keeps Popen waiting until it exits; one holding the
        # reply pipe hides this worker's death (no EOF); one holding the request pipe or the
        # slot outlives us with them. So a start runs under FORK_LOCK, which every fork waits
        # for, and the worker is in _LIVE before it is let go: a forked child closes copies.
        from kernelcache.runners.slots import waiting_path

        entries = json.dumps([p for p in sys.path if isinstance(p, str)])  # what imports look in (not a Path)
        args = [sys.executable, *boot_flags(), "-c", _BOOT, entries, nvrtc[0], repr(idle_s), waiting_path()]
        errors = tempfile.TemporaryFile(prefix="kernelcache-worker-")  # noqa: SIM115 - unlinked at once: ours alone, kept
        with FORK_LOCK:
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
            to, from_ = Connection(req_w, readable=False), Connection(rep_r, writable=False)
            try:
                proc = subprocess.Popen(
                    [*args, str(req_r), str(rep_w)],
                    pass_fds=(req_r, rep_w, slot_fd) if slot_fd >= 0 else (req_r, rep_w),
                    stdin=subprocess.DEVNULL,
                    stderr=errors,
                    env=environ_copy(),
                )
            except BaseException:
                to.close()
                from_.close()
                errors.close()
                raise
            finally:
                os.close(req_r)
                os.close(rep_w)
                if slot_fd >= 0:
                    os.close(slot_fd)  # the worker's now (or, had it not started, free): it frees the slot when it ends
            worker = cls(proc, to, from_, errors, nvrtc)
            _LIVE.add(worker)
        return worker

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def exchange(self, kind: str, args: bytes) -> tuple[Any, ...]:
        """Send one compile (its arguments pickled), return its reply ``(outcome, value,
        warnings)``; Died if the worker ended, Retired if it ended by itself, idle."""
        self._seq += 1
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None  # deleted: the worker compiles in a deleted directory too (job.take_on)
        # Only builtins around the arguments: a worker can always read the sequence number,
        # and answers "unreadable" for arguments it cannot unpickle.
        message = (self._seq, kind, cwd, environ_copy(), list(sys.path), args)
        try:
            self._to.send_bytes(pickle.dumps(message, pickle.HIGHEST_PROTOCOL))
            self.wait_ready()
            self.compiling = True
            # A whole message or EOFError: a worker killed while writing its reply leaves
            # nothing that could be taken for a result.
            reply = pickle.loads(self._from.recv_bytes())
        except (EOFError, OSError) as exc:
            # Race: an idle worker ends by itself (worker_main._next_compile) and says "bye"
            # first; a compile sent after it ended finds the pipe closed (EPIPE), yet its
            # "bye" is still there to read: it retired, it did not die.
            if self._said_bye():
                raise Retired(f"compiler worker {self.pid} ended, idle") from None
            raise Died(self.started, self._why_ended(exc)) from None
        finally:
            self.compiling = False
        if reply == ("bye",):
            raise Retired(f"compiler worker {self.pid} ended, idle")
        if reply[0] != self._seq:
            raise Died(self.started, f"compiler worker {self.pid} answered #{reply[0]} for #{self._seq}")
        return reply[1:]  # type: ignore[no-any-return]

    def wait_ready(self) -> None:
        """Wait for its hello: booted, our kernelcache and NVRTC loaded, NVRTC's first compile
        done (worker_main._warm_up). Died where it ended first, or is not ours."""
        if self.started:
            return
        try:
            said = pickle.loads(self._from.recv_bytes())
        except (EOFError, OSError) as exc:
            raise Died(False, self._why_ended(exc)) from None
        self._check_hello(said)

    def _said_bye(self) -> bool:
        try:
            while self._from.poll(0):
                if pickle.loads(self._from.recv_bytes()) == ("bye",):
                    return True
        except (EOFError, OSError, pickle.UnpicklingError):
            pass
        return False

    def _check_hello(self, said: Any) -> None:
        """It is ready, runs our kernelcache, and mapped our NVRTC (or it is never used)."""
        if not (isinstance(said, tuple) and len(said) == 4 and said[:2] == ("ready", self.pid)):
            raise Died(False, f"compiler worker {self.pid} said {said!r}, not that it is ready")
        theirs, mapped = said[2], said[3]
        if theirs != package_dir():
            # A checkout moved or deleted since we imported ours leaves another copy found
            # further down sys.path (an editable install's), whose code is not ours.
            raise Died(False, f"compiler worker {self.pid} runs kernelcache from {theirs}, not {package_dir()}", True)
        if [identity for _, identity in mapped] != [self.nvrtc[1]]:
            shown = ", ".join(f"{path} ({identity})" for path, identity in mapped) or "none"
            raise Died(
                False,
                f"compiler worker {self.pid} mapped libnvrtc {shown}, not {self.nvrtc[0]} ({self.nvrtc[1]}), "
                "which this process compiles with",
                True,
            )
        self.started = True

    def _why_ended(self, exc: BaseException) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return f"compiler worker {self.pid} stopped answering ({type(exc).__name__})"
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        said = self.last_words()
        return f"compiler worker {self.pid} {how}" + (f"; its last words: {said}" if said else "")

    def last_words(self, limit: int = 600) -> str:
        """The end of what the worker wrote to its stderr, on one line ("" for nothing)."""
        try:
            size = os.fstat(self._errors.fileno()).st_size
            text = os.pread(self._errors.fileno(), limit, max(0, size - limit)).decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-4:])

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
        self._errors.close()

    def forget(self) -> None:
        """In a forked child: drop this process's copies of the pipes; the worker is the parent's."""
        for end in (self._to, self._from, self._errors):
            try:
                end.close()
            except OSError:
                pass  # one end that cannot be closed must not keep the other, or other workers', open


def environ_copy() -> dict[str, str]:
    """A copy of os.environ now. Race: a variable another thread removes while it is copied
    raises KeyError: copy again. Workers start with this copy, not the C library's ``environ``,
    which such a thread rewrites while the child execs (execve failed with EFAULT)."""
    while True:
        try:
            return dict(os.environ)
        except KeyError:
            continue


# Held while workers' pipes are made or closed, and by each fork; reentrant: a fork by its holder goes on.
FORK_LOCK = threading.RLock()
_LIVE: set[Worker] = set()  # every worker whose pipes this process holds open
_FORGOTTEN: list[Any] = []  # the parent's workers, in a forked child: never collected there


def _forget_in_child() -> None:
    global FORK_LOCK
    FORK_LOCK = threading.RLock()  # held by the forking thread, in the parent's copy
    for worker in list(_LIVE):
        worker.forget()
    _FORGOTTEN.append(list(_LIVE))
    _LIVE.clear()


# No worker starts or closes while a fork copies this process (Worker.start says why).
os.register_at_fork(
    before=lambda: FORK_LOCK.acquire(), after_in_parent=lambda: FORK_LOCK.release(), after_in_child=_forget_in_child
)
