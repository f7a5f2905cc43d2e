"""The caller's side of the compile server (server.py): find this node's server for this very
interpreter and environment, start it when none runs, and take a warm worker from it.

Where: ``$XDG_RUNTIME_DIR/kernelcache``, else ``<tmp>/kernelcache-<euid>``, which must be a
directory of ours that nobody else can enter (mode 0700): whoever can create a socket there
could hand us a worker of theirs. We use one only after checking that; the server answers only
peers of its own uid (SO_PEERCRED), and we check the server's uid the same way.

Which server: the socket is named by fingerprint.fingerprint() (what a worker takes from the
process that starts it rather than per compile): a process that differs gets a server of its own.

Every failure here is a fallback, never an error: no usable directory, no server, a server that
does not answer in time: the pool starts its worker itself, as without a server, with one warning
for a server that failed (not for one that is merely absent or busy).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

from kernelcache import forksafe
from kernelcache.compile import worker_proc
from kernelcache.compile.fingerprint import fingerprint, server_sys_path
from kernelcache.log import WarnOnce

__all__ = ["adopt_worker", "server_status", "socket_path", "stop_server"]

_REPLY_S = 10.0  # a worker's start on a loaded host is well under it; past it the server counts as stuck
_QUEUE_S = 1.0  # a server whose queue stays full this long is stuck (or swamped): not used
_SUN_PATH_MAX = 107  # sockaddr_un's sun_path, less its NUL
# The most idle workers a server keeps: one per core up to this. An idle worker is ~90 MB RSS,
# ~30 MB of it its own (2-core host, no driver: more where NVRTC initialised one), and a batch
# of 64 small misses on 16 cores compiled as fast on 8 warm workers as on 16.
MAX_IDLE_WORKERS = 16

_warned = WarnOnce()
_start_lock = threading.Lock()
_started: set[str] = set()  # sockets this process started a server for (once each)
_broken: dict[str, str] = {}  # socket -> why this process stopped asking it


def _reset_in_child() -> None:
    # Race: a thread starting the server holds _start_lock until the server's first process
    # has forked; a child forked meanwhile has the lock held by nobody, and would wait forever.
    global _start_lock
    _start_lock = threading.Lock()


forksafe.reset_function_in_child(_reset_in_child)


def server_dir() -> str:
    """The directory of this user's compile servers (not created, not checked): in
    $XDG_RUNTIME_DIR where that is this euid's, as the XDG spec has it. Under sudo it may
    still name the user's: root's servers do not move in there (that user could neither use
    the directory root made nor remove it)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and _owned(runtime):
        return os.path.join(runtime, "kernelcache")
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"kernelcache-{os.geteuid()}")


def _owned(path: str) -> bool:
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return False


def private_dir() -> str | None:
    """server_dir(), created if absent, when it is ours and closed to others; else None with one warning."""
    import stat

    path = server_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        _warned.warn(f"dir-{path}", f"compile server not used: cannot create {path} ({exc})", stacklevel=5)
        return None
    try:
        st = os.lstat(path)
    except OSError as exc:
        _warned.warn(f"dir-{path}", f"compile server not used: {path}: {exc}", stacklevel=5)
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        # Never chmod or remove it: it may be somebody else's (a planted directory, a team's).
        _warned.warn(
            f"dir-{path}",
            f"compile server not used: {path} is not a directory of uid {os.geteuid()} closed to others "
            f"(owner {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); remove it or set XDG_RUNTIME_DIR",
            stacklevel=5,
        )
        return None
    return path


def socket_path() -> str | None:
    """The socket of this process's compile server, or None where none can be used here."""
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "recv_fds"):
        return None  # a worker we did not start is watched through its pidfd (Linux 5.3+)
    root = private_dir()
    if root is None:
        return None
    path = os.path.join(root, fingerprint() + ".sock")
    if len(os.fsencode(path)) > _SUN_PATH_MAX:
        _warned.warn(f"long-{root}", f"compile server not used: {path} is too long for a Unix socket", stacklevel=4)
        return None
    return path


def adopt_worker() -> worker_proc.Worker | None:
    """A warm worker from the node's compile server, or None: start one here instead.

    ConfigError for a bad KERNELCACHE_COMPILE_SERVER value; nothing else raises."""
    from kernelcache import config

    if not config.compile_server():
        return None
    path = socket_path()
    if path is None or path in _broken:
        return None
    try:
        sock = _connect(path, start=True)
        if sock is None:
            return None
        with sock:
            return _take_worker(sock, path)
    except _Unusable as exc:
        _broken[path] = str(exc)
        _warned.warn(f"broken-{path}", f"compile server not used from now on: {exc}", stacklevel=4)
        return None


class _Unusable(Exception):
    """The server does something a server must not (no answer in time, a foreign uid, a bad reply)."""


def _connect(path: str, start: bool) -> socket.socket | None:
    """A connection to the server at ``path``; None where none answers. With ``start``, one is
    started then, for the processes after this one: this one does not wait for it."""
    sock = _try_connect(path)
    if sock is not None or not start:
        return sock
    # Why not wait: a process that waited for the server it started would wait for it to listen
    # (~75 ms) and then for the workers it starts and warms, where starting its own costs the
    # same without those waits (H200, 64 misses in the node's first process: 0.53 s waiting,
    # 0.43 s without a server). So this process's workers start here, and the server is warm
    # for the next one. Threads of this process that ask once it listens take its workers.
    with _start_lock:
        if path not in _started:
            _started.add(path)  # once per process: a server that exits at once is not started again and again
            _start_server(path)
    return None


def _try_connect(path: str) -> socket.socket | None:
    """A connection to a listener at ``path``, None where none listens; _Unusable where it is
    another uid's or its queue stays full."""
    deadline = time.monotonic() + _QUEUE_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # Race: a blocking connect to a listener whose queue is full waits for room, and that
        # is forever when the server is stopped or stuck: its queue keeps the connection of
        # every process that gave up on it until it accepts. So the connect never blocks: a
        # full queue (EAGAIN) is retried for a moment (a busy server drains it in milliseconds).
        sock.setblocking(False)
        try:
            sock.connect(path)
            break
        except BlockingIOError:
            sock.close()
            if time.monotonic() > deadline:
                raise _Unusable(f"{path}: the server accepts no connection (its queue is full)") from None
            time.sleep(0.01)
        except OSError:  # no socket, nobody listening (ECONNREFUSED)
            sock.close()
            return None
    sock.setblocking(True)
    uid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
    if uid != os.geteuid():
        sock.close()
        raise _Unusable(f"{path} is served by uid {uid}, not {os.geteuid()}")
    return sock


def _start_server(path: str) -> None:
    """Start the server for ``path``, detached: its own session, no terminal, / as its cwd,
    this process's environment; it forks once and the first process exits, so it is nobody's child."""
    import subprocess

    from kernelcache import config
    from kernelcache.compile.workers import usable_cores

    boot = (
        "import os\nif os.fork(): os._exit(0)\n"
        "import sys, json; sys.path[:] = json.loads(sys.argv[1])\n"
        "from kernelcache.compile.server import main; main()"
    )
    args = [sys.executable, *worker_proc.boot_flags(), "-c", boot, json.dumps(server_sys_path()), path]
    args += [str(config.compile_server_idle_s()), str(min(MAX_IDLE_WORKERS, max(2, usable_cores())))]
    with worker_proc.FORK_LOCK:  # Popen's exec-status pipe must not be copied by a fork (Worker.start)
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
            env=worker_proc.environ_copy(),
        )
    proc.wait()  # the first process ends right after its fork: nothing of it is left to reap


def _request(sock: socket.socket, what: str) -> tuple[dict[str, Any], worker_proc.Worker | None]:
    """Send one request; return the server's reply and the worker that came with it, if one did."""
    import select

    try:
        sock.sendall(what.encode() + b"\n")
    except OSError:  # it ended as we connected (killed, or exiting)
        return _GONE, None
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(int(_REPLY_S * 1000)):  # not under FORK_LOCK: no fork waits for this
        raise _Unusable(f"the server did not answer {what!r} in {_REPLY_S:g} s")
    # Race: a fork by another thread between receiving a worker's fds and adopting them would
    # copy them into a child that cannot know they are a worker's pipes (Worker.start): both
    # happen in one hold of FORK_LOCK, and fds that are not adopted are closed in it.
    with worker_proc.FORK_LOCK:
        try:
            data, fds, flags, _ = socket.recv_fds(sock, 4096, 3, socket.MSG_CMSG_CLOEXEC)
        except OSError:  # ECONNRESET: it ended (killed, say) before it read our request
            return _GONE, None
        try:
            reply = json.loads(data) if data.endswith(b"\n") and not flags & socket.MSG_CTRUNC else None
        except ValueError:
            reply = None
        if data == b"" and not fds:
            reply = _GONE  # it exited (idle) as we asked: no server, not a broken one
        ours = isinstance(reply, dict) and reply.get("kernelcache") == worker_proc.package_dir()
        if isinstance(reply, dict) and reply.get("worker") and len(fds) == 3 and ours:
            return reply, worker_proc.Worker.adopt(fds[0], fds[1], int(reply["pid"]), fds[2])
        for fd in fds:
            os.close(fd)
    if not isinstance(reply, dict):
        raise _Unusable(f"the server sent {data[:80]!r} in reply to {what!r}")
    if reply.get("worker") and not ours:  # a server that imported another copy of kernelcache
        theirs, mine = reply.get("kernelcache"), worker_proc.package_dir()
        raise _Unusable(f"its workers run kernelcache from {theirs!r}, not {mine!r}")
    return reply, None


_GONE: dict[str, Any] = {"gone": True}  # the reply of a server that ended: none runs, none misbehaved


def _take_worker(sock: socket.socket, path: str) -> worker_proc.Worker | None:
    reply, worker = _request(sock, "worker")
    if worker is None and "worker" not in reply and not reply.get("gone"):
        raise _Unusable(f"the server at {path} replied {reply!r} when asked for a worker")
    if worker is None and reply.get("broken"):
        # Still asked later: what keeps workers from starting there may pass (it tries again).
        _warned.warn(
            f"none-{path}",
            f"compile server gives no workers now ({reply.get('why')}); this process starts its own",
            stacklevel=5,
        )
    return worker  # None: none to spare now (all are out, or workers cannot start there)


def server_status(path: str | None = None) -> dict[str, Any] | None:
    """The server's own account (``idle``, ``starting``, ``pid``, ``target``, ``given``), or None when none runs."""
    path = path or socket_path()
    sock = _connect(path, start=False) if path else None
    if sock is None:
        return None
    with sock:
        reply = _request(sock, "status")[0]
    return None if reply is _GONE else reply


def stop_server(path: str | None = None) -> bool:
    """Ask the server to exit now (its idle workers with it); False when none runs."""
    path = path or socket_path()
    sock = _connect(path, start=False) if path else None
    if sock is None:
        return False
    with sock:
        return bool(_request(sock, "stop")[0].get("stopping"))


def list_servers() -> list[tuple[str, dict[str, Any] | None]]:
    """Every compile server of this user (all fingerprints): ``(socket, status)``, status None
    for a socket nobody answers on (a server that died; the next one there replaces it)."""
    root = server_dir()
    try:
        names = sorted(n for n in os.listdir(root) if n.endswith(".sock"))
    except OSError:
        return []
    if private_dir() is None:
        return []  # not ours alone: nothing there is talked to
    found = []
    for name in names:
        path = os.path.join(root, name)
        try:
            found.append((path, server_status(path)))
        except _Unusable:
            found.append((path, None))
    return found
