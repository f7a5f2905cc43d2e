"""The compile server: warm compiler workers kept per node, user and environment, handed over
to the processes that need them.

Why: a worker's start is an interpreter, NVRTC's load and, on a GPU host, the CUDA driver's
initialisation that NVRTC 13.0 runs in a process's first compile (~0.2 s, nearly all system
time; benchmarks/bench_nvrtc_first.py). A pool that starts its workers inside compile_many pays
that in every process. The server starts workers ahead, runs one small compile in each so that
it has paid it, and gives them away: a process takes a worker (its two pipe ends and a pidfd,
passed over the Unix socket with SCM_RIGHTS) and from then on talks to it exactly as to one it
started (worker_proc.py); the worker ends when that process closes its pipe or exits. A worker
is never given twice and never taken back, so no state of one process's compiles (its
environment, cwd, NVRTC's --restrict) reaches another's.

The rules (ccache's and sccache's hazards, named):
- one server per socket path, i.e. per user and fingerprint (server_link.py says what goes
  into it); a flock on ``<socket>.lock``, held for the server's life, makes it the only one;
- peers of another uid are refused (SO_PEERCRED), in a directory closed to others anyway;
- nothing waits on one client: a request is read when it is there, and a connection without
  one after a second is hung up on, so a stopped process or a silent probe holds up nobody;
- workers start on demand while a process waits for them, and the server tops itself up to
  ``target`` idle workers only after a quiet second with nothing handed out, so it does not
  compete for the cores with the compiles of the process it just served;
- where workers die before they are warm (3 in a row), it answers "none" and starts none,
  for _BROKEN_S; then it tries one, and gives them out again once one gets warm;
- it exits after ``idle`` seconds without a request (KERNELCACHE_COMPILE_SERVER_IDLE), taking its
  idle workers with it; it stops listening then, but waits for the workers it handed over to end
  (their processes let them go), so that none is left to an init that never reaps; stdin,
  stdout and stderr are /dev/null and it has its own session, so it holds no terminal, pipe or
  job of whoever started it.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from kernelcache.compile import server_files
from kernelcache.compile.server_worker import HeldWorker, still_idle
from kernelcache.compile.worker_proc import hello, package_dir

QUIET_S = 1.0  # after a hand-over, this long without one before idle workers are topped up
_TICK_S = 0.25
_START_S = 5.0  # a worker not warm this long after its start is not counted on (it is far past any start)
_START_FAILURES = 3  # workers in a row that die before they are warm: workers cannot run here
_BROKEN_S = 10.0  # for this long after that; then the server tries again
_REQUEST_S = 1.0  # a client sends its request as it connects; one without a request this long is hung up on
_PENDING_MAX = 32  # connections held open at once waiting for their request (each an fd)


class _Client:
    """A connection whose request has not (all) arrived yet."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.since, self.data = conn, time.monotonic(), b""


class Server:
    def __init__(self, path: str, idle_s: float, target: int) -> None:
        self.path, self.idle_s, self.target = path, idle_s, target
        self.sel = selectors.DefaultSelector()
        self.idle: list[HeldWorker] = []
        self.starting: set[HeldWorker] = set()
        self.waiting: collections.deque[socket.socket] = collections.deque()
        self.pending: set[_Client] = set()  # connected, request not read yet
        self.given: list[subprocess.Popen[bytes]] = []  # handed over; reaped here when they end
        self.failures = 0
        self.broken = ""  # why workers cannot start here ("" while they can)
        self.broken_at = 0.0
        self.last_request = self.last_given = time.monotonic()
        self.handed = 0
        self.listener = server_files.listen(path)
        self.inode = os.stat(path).st_ino  # the socket's file: unlinked at exit only if still this one
        self.sel.register(self.listener, selectors.EVENT_READ, None)

    def serve(self) -> None:
        try:
            while True:
                for key, _ in self.sel.select(_TICK_S):
                    if key.data is None:
                        self._accept()
                    elif isinstance(key.data, _Client):
                        self._from_client(key.data)
                    else:
                        self._from_worker(key.data)
                if self._tick():
                    return
        finally:
            self._shut()

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        """A new connection: refused unless it is our uid's; its request read as it arrives."""
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            ours = struct.unpack("3i", creds)[1] == os.geteuid()
        except OSError:
            ours = False
        if not ours:
            conn.close()
            return
        # Race: a client sends its request right after it connects, but a process stopped or
        # killed in between, or a probe that connects and sends nothing, must not hold up
        # every other process: this loop is the whole server. So a request is never waited
        # for: it is read when it is there, and a connection still without one _REQUEST_S
        # later is hung up on (_tick).
        conn.setblocking(False)
        if len(self.pending) >= _PENDING_MAX:  # a flood of them: room for this one, files for the rest
            self._hang_up(min(self.pending, key=lambda c: c.since))
        client = _Client(conn)
        self.pending.add(client)
        self.sel.register(conn, selectors.EVENT_READ, client)
        self._from_client(client)  # it is usually there already

    def _from_client(self, client: _Client) -> None:
        try:
            chunk = client.conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        client.data += chunk
        if chunk and b"\n" not in client.data and len(client.data) < 64:
            return  # the rest is on its way
        self._hang_up(client, close=False)
        self._answer(client.conn, client.data.strip())

    def _hang_up(self, client: _Client, close: bool = True) -> None:
        self.sel.unregister(client.conn)
        self.pending.discard(client)
        if close:
            client.conn.close()

    def _answer(self, conn: socket.socket, what: bytes) -> None:
        self.last_request = time.monotonic()
        if what == b"worker":
            self._want_worker(conn)
        elif what == b"status":
            self._reply(conn, self.status())
        elif what == b"stop":
            self._reply(conn, {"stopping": True})
            self.idle_s = 0.0  # exits at the next tick
        else:
            conn.close()

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "idle": len(self.idle),
            "starting": len(self.starting),
            "waiting": len(self.waiting),
            "target": self.target,
            "given": self.handed,
            "workers": sorted(w.proc.pid for w in [*self.idle, *self.starting]),
            "broken": self.broken,
        }

    def _want_worker(self, conn: socket.socket) -> None:
        while self.idle:
            worker = self.idle.pop()
            if not still_idle(worker):
                self._drop(worker)
                continue
            if not self._give(conn, worker):
                self.idle.append(worker)  # that process is gone: the worker waits for the next
            return
        if self.broken:
            self._reply(conn, {"worker": False, "why": self.broken, "broken": True})
            return
        self.waiting.append(conn)
        self._start_for_waiting()

    def _start_for_waiting(self) -> None:
        """A start for each waiting process that no worker on its way is for. Race: a start
        that hangs (stopped, a driver that does not answer) would keep a process waiting
        until it gives up on the server: one starting for _START_S is written off, once, and
        so replaced once (a slow host gets a start more, not one per tick)."""
        now = time.monotonic()
        for worker in self.starting:
            worker.written_off = worker.written_off or now - worker.since >= _START_S
        coming = sum(1 for worker in self.starting if not worker.written_off)
        for _ in range(len(self.waiting) - coming):
            self._start()

    def _start(self) -> None:
        try:
            worker = HeldWorker()
        except Exception as exc:  # no fds left, no interpreter
            self._failed(f"cannot start a compiler worker: {exc}")
            return
        self.starting.add(worker)
        self.sel.register(worker.replies, selectors.EVENT_READ, worker)

    def _from_worker(self, worker: HeldWorker) -> None:
        if worker.replies.closed:
            return  # handed over or dropped earlier in this batch of events
        try:
            message = pickle.loads(worker.replies.recv_bytes())
        except Exception:  # EOFError: it died (killed, out of memory, a broken environment)
            self._drop(worker)
            if not worker.warm:
                self._failed(f"compiler worker {worker.proc.pid} ended before it was ready")
            return
        if not worker.warm and message[:2] == ("ready", worker.proc.pid) and message != hello(worker.proc.pid):
            self._drop(worker)  # imported another kernelcache than ours (worker_proc.hello): it cannot start here
            self._failed(f"compiler worker {worker.proc.pid} imported kernelcache from {message[2:]!r}, not ours")
        elif not worker.warm and message == hello(worker.proc.pid):
            # The one compile a worker runs here: NVRTC initialises the driver in it.
            warm_up = (1, "warm", "/", dict(os.environ), list(sys.path), b"")
            worker.to.send_bytes(pickle.dumps(warm_up, pickle.HIGHEST_PROTOCOL))
        elif not worker.warm and message[:2] == (1, "warm"):
            worker.warm = True
            self.failures = 0
            self.starting.discard(worker)
            while self.waiting:
                if self._give(self.waiting.popleft(), worker):
                    return
            self.idle.append(worker)
        else:
            self._drop(worker)  # nothing else may come from a worker that has not been given a compile

    def _give(self, conn: socket.socket, worker: HeldWorker) -> bool:
        """Hand ``worker`` to the client on ``conn``; False if that client has gone: the worker
        is then still ours, and the caller keeps it (in ``idle`` once, never twice)."""
        fds = [worker.to.fileno(), worker.replies.fileno(), worker.pidfd]
        payload = json.dumps({"worker": True, "pid": worker.proc.pid, "kernelcache": package_dir()}).encode() + b"\n"
        try:
            socket.send_fds(conn, [payload], fds)
        except OSError:
            conn.close()
            return False
        conn.close()
        # Our copies go now: the client holds the only writing end of its request pipe.
        self.sel.unregister(worker.replies)
        worker.close()
        self.given.append(worker.proc)
        self.handed += 1
        self.last_given = time.monotonic()
        return True

    def _drop(self, worker: HeldWorker) -> None:
        self.sel.unregister(worker.replies)
        self.starting.discard(worker)
        if worker in self.idle:
            self.idle.remove(worker)
        worker.end()
        self.given.append(worker.proc)  # reaped with the handed-over ones

    def _failed(self, why: str) -> None:
        self.failures += 1
        if self.failures >= _START_FAILURES:
            self.broken, self.broken_at = why, time.monotonic()
            while self.waiting:
                self._reply(self.waiting.popleft(), {"worker": False, "why": why, "broken": True})
        else:
            self._start_for_waiting()

    def _tick(self) -> bool:
        """Reap, top up, and say whether it is time to exit."""
        self.given = [proc for proc in self.given if proc.poll() is None]
        now = time.monotonic()
        for client in [c for c in self.pending if now - c.since >= _REQUEST_S]:
            self._hang_up(client)
        if not self.waiting and now - self.last_request >= self.idle_s:
            return True
        if self.broken and now - self.broken_at >= _BROKEN_S:
            # What kept workers from starting may have passed (memory, processes or files
            # short for a moment, a checkout away): one more try, once in a while. The
            # failures stay counted until a worker gets warm: one more is broken again.
            self.broken = ""
        if self.waiting and not self.broken:
            self._start_for_waiting()
        quiet = now - self.last_given >= QUIET_S
        if quiet and not self.waiting:
            # Workers started for processes that left before theirs was warm (killed,
            # interrupted, past their wait) stay idle: ``target`` are kept, not one per such.
            for worker in self.idle[: max(0, len(self.idle) - self.target)]:
                self._drop(worker)
        if quiet and not self.broken and not self.waiting:
            wanted = self.target - len(self.idle) - len(self.starting)
            for _ in range(min(wanted, 1 - len(self.starting)) if self.failures else wanted):
                self._start()  # after failures, one at a time until one gets warm
        return False

    def _shut(self) -> None:
        """Stop listening first (a new process then starts a new server), answer who is already
        queued, then let the idle workers go."""
        server_files.unlink_if_ours(self.path, self.inode)
        self.listener.setblocking(False)
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                break
            self._take(conn)
        for client in list(self.pending):  # their requests are not there yet: nobody waits for them
            self._hang_up(client)
        self.listener.close()
        for conn in self.waiting:
            self._reply(conn, {"worker": False, "why": "the server is exiting"})
        for worker in [*self.idle, *self.starting]:
            worker.end()

    @staticmethod
    def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass
        conn.close()


def main() -> None:
    """``sys.argv[2:]`` = [socket path, idle seconds, target idle workers] (server_link._start_server)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    path, idle_s, target = sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
    lock_path = path[: -len(".sock")] + ".lock"
    lock = server_files.exclusive(lock_path)
    if lock is None:
        return  # another server runs (or is about to exit and will be replaced on the next request)
    server_files.clear_dead(os.path.dirname(path), os.path.basename(lock_path))
    Server(path, idle_s, target).serve()
    # Its socket is gone: a process that asks now starts a new server, which takes the lock
    # once it is let go here (it waits LOCK_WAIT_S for it), while this one waits for its children.
    server_files.let_go(lock_path, lock)
    _reap_children()


def _reap_children() -> None:
    """Wait for every process this server started: the idle workers it just ended, and the
    handed-over ones, which serve their process until it lets them go. One that outlived the
    server would go to the PID namespace's init, which in a container is often the user's own
    program (``docker run image python app.py``): it reaps none, and each would stay a zombie
    for that program's life."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return  # none left
