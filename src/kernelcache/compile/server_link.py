"""The caller's side of the compile server (server.py): find this node's server for this very
interpreter and environment, start it when none runs, and take a warm worker from it.

Where: ``$XDG_RUNTIME_DIR/kernelcache``, else ``<tmp>/kernelcache-<euid>``, which must be a
directory of ours that nobody else can enter (mode 0700): whoever can create a socket there
could hand us a worker of theirs. We use one only after checking that; the server answers only
peers of its own uid (SO_PEERCRED), and we check the server's uid the same way.

Which server: the socket is named by a fingerprint of everything a worker takes from the process
that starts it and does not take per compile (the working directory and the environment travel
with every compile): the interpreter and its flags, sys.path (its relative entries, '' among
them, joined to the cwd: the server runs in /) and the files on it (the mtimes of
its directories change with every install), kernelcache's own files, the variables read at start
(CUDA_*, NV*, LD_*, PYTHON*, LLVM_*, LIBNVVM*, PATH, CONDA_PREFIX), ids, cgroup,
namespaces and root directory (a chroot), CPU affinity, umask, limits, niceness. A process
that differs in any of them gets a server of its own.

Every failure here is a fallback, never an error: no usable directory, no server, a server that
does not answer in time: the pool starts its worker itself, as without a server, with one warning
for a server that failed (not for one that is merely absent or busy).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

from kernelcache.compile import worker_proc
from kernelcache.log import WarnOnce

__all__ = ["adopt_worker", "server_status", "socket_path", "stop_server"]

PROTOCOL = "kernelcache-compile-server-1"
_CONNECT_S = 3.0  # how long a process that started the server waits for it to listen
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
    # Race: a thread waiting for the server it started holds _start_lock for seconds; a
    # child forked meanwhile has the lock held by nobody, and would wait for it forever.
    global _start_lock
    _start_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_in_child)


def server_dir() -> str:
    """The directory of this user's compile servers (not created, not checked)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "kernelcache")
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"kernelcache-{os.geteuid()}")


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


def fingerprint() -> str:
    """24 hex digits naming the server whose workers this process may use (module docstring)."""
    parts: dict[str, Any] = {
        "protocol": PROTOCOL,
        "python": [os.path.realpath(sys.executable), sys.version, list(sys.flags), worker_proc.boot_flags()],
        "path": _server_sys_path(),
        "installed": _install_stamps(),
        "kernelcache": _package_stamps(),
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES),
        "ids": [os.geteuid(), os.getegid(), sorted(os.getgroups())],
        "proc": _proc_facts(),
        "nice": os.nice(0),
    }
    try:
        parts["cpus"] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        parts["cpus"] = os.cpu_count()
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


# What the interpreter, the loader and cuda.pathfinder read at a worker's start (CONDA_PREFIX
# picks the libnvrtc loaded where no wheel has one), and what libnvrtc reads once, when it is
# loaded, rather than per compile (a getenv log of libnvrtc 13.0: NVRTC_*, NV_NVVM_VERSION,
# LIBNVVM_DISABLE_CONCURRENT_API, LLVM_OVERRIDE_PRODUCER, which goes into every LTO-IR, and
# AS_SECURE_LOG_FILE). What a compile reads at compile time travels with it.
_ENV_PREFIXES = ("CUDA", "NV", "LD_", "PYTHON", "LLVM_", "LIBNVVM")
_ENV_NAMES = ("PATH", "CONDA_PREFIX", "AS_SECURE_LOG_FILE")


def _server_sys_path() -> list[str]:
    """sys.path as this process resolves it now: relative entries ('' included: the cwd, for
    ``python -c`` and the REPL) joined to the working directory, and dropped where it was
    deleted (nothing resolves there). The server and its workers run in /: given '' they
    import kernelcache and cuda from / or from further down sys.path, i.e. another copy or
    none (then no server ever came up, and every process waited for one)."""
    try:
        here: str | None = os.getcwd()
    except OSError:
        here = None
    return [
        p if os.path.isabs(p) else os.path.normpath(os.path.join(here, p))
        for p in sys.path
        if here is not None or os.path.isabs(p)
    ]


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path or ".")
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def _install_stamps() -> list[Any]:
    """The directories an install or upgrade of what a worker imports rewrites: site-packages
    themselves (a new dist-info), cuda's packages, NVIDIA's library wheels. Not the other
    entries of sys.path: a script's directory (often /tmp, or the cwd) changes all the time."""
    import importlib.util

    dirs = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    # Found through the namespace packages, never an imported module's own __path__ or
    # origin: cuda.core rewrites its own on import (to cu13/), so they would differ by import.
    for top, subdirs in (("cuda", ("bindings", "core", "pathfinder")), ("nvidia", None)):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        for location in (spec and spec.submodule_search_locations) or ():
            if subdirs is None:  # nvidia/<wheel>/lib: libnvrtc and the other libraries
                with os.scandir(location) as entries:
                    dirs += [os.path.join(e.path, "lib") for e in entries if e.is_dir()]
            else:
                dirs += [os.path.join(location, sub) for sub in subdirs]
    return [[d, _stamp(d)] for d in dirs]


def _package_stamps() -> list[Any]:
    """(file, mtime, size) of every module of kernelcache: an edited checkout gets a new server."""
    global _PACKAGE
    if _PACKAGE is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        found = []
        for top, dirs, files in os.walk(root):
            dirs.sort()
            found += [[os.path.join(top, f), _stamp(os.path.join(top, f))] for f in sorted(files) if f.endswith(".py")]
        _PACKAGE = found
    return _PACKAGE


_PACKAGE: list[Any] | None = None


def _proc_facts() -> list[str]:
    """cgroup, namespaces, umask, root and limits, as /proc shows them (what a started process inherits)."""
    import resource

    facts = []
    for name in ("cgroup", "ns/mnt", "ns/pid", "ns/user", "ns/net", "ns/ipc", "ns/uts", "ns/cgroup", "attr/current"):
        try:
            path = f"/proc/self/{name}"
            facts.append(os.readlink(path) if name.startswith("ns/") else _read(path))
        except OSError:
            facts.append("")
    try:
        facts += [line for line in _read("/proc/self/status").splitlines() if line.startswith("Umask:")]
    except OSError:
        pass
    facts.append(_root())
    for limit in ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_NPROC"):
        facts.append(f"{limit}={resource.getrlimit(getattr(resource, limit))}")
    return facts


def _root() -> str:
    """Which root directory this process sees. A chroot has the same namespaces and paths
    but other files at them (headers, libraries): the mount its / is (a bind mount of the
    real / is another mount) and that directory's inode."""
    st = os.stat("/")
    mount = ""
    try:
        for line in _read("/proc/self/mountinfo").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) > 4 and fields[4] == "/":
                mount = fields[0]  # the last one listed is the one on top
    except OSError:
        pass
    return f"root={st.st_dev}:{st.st_ino}:{mount}"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


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
    """A connection to the server at ``path``; with ``start``, start one when none answers there."""
    sock = _try_connect(path)
    if sock is not None or not start:
        return sock
    with _start_lock:
        sock = _try_connect(path)
        if sock is None and path not in _started:
            _started.add(path)  # once per process: a server that exits at once is not started again and again
            _start_server(path)
            deadline = time.monotonic() + _CONNECT_S
            while sock is None and time.monotonic() < deadline:
                time.sleep(0.005)
                sock = _try_connect(path)
    return sock


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
    args = [sys.executable, *worker_proc.boot_flags(), "-c", boot, json.dumps(_server_sys_path()), path]
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

    sock.sendall(what.encode() + b"\n")
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(int(_REPLY_S * 1000)):  # not under FORK_LOCK: no fork waits for this
        raise _Unusable(f"the server did not answer {what!r} in {_REPLY_S:g} s")
    # Race: a fork by another thread between receiving a worker's fds and adopting them would
    # copy them into a child that cannot know they are a worker's pipes (Worker.start): both
    # happen in one hold of FORK_LOCK, and fds that are not adopted are closed in it.
    with worker_proc.FORK_LOCK:
        data, fds, flags, _ = socket.recv_fds(sock, 4096, 3, socket.MSG_CMSG_CLOEXEC)
        try:
            reply = json.loads(data) if data.endswith(b"\n") and not flags & socket.MSG_CTRUNC else None
        except ValueError:
            reply = None
        if data == b"" and not fds:
            reply = {"gone": True}  # it exited (idle) as we asked: no server, not a broken one
        if isinstance(reply, dict) and reply.get("worker") and len(fds) == 3:
            return reply, worker_proc.Worker.adopt(fds[0], fds[1], int(reply["pid"]), fds[2])
        for fd in fds:
            os.close(fd)
    if not isinstance(reply, dict):
        raise _Unusable(f"the server sent {data[:80]!r} in reply to {what!r}")
    return reply, None


def _take_worker(sock: socket.socket, path: str) -> worker_proc.Worker | None:
    reply, worker = _request(sock, "worker")
    if worker is None and "worker" not in reply and not reply.get("gone"):
        raise _Unusable(f"the server at {path} replied {reply!r} when asked for a worker")
    return worker  # None: none to spare now (all are out, or workers cannot start there)


def server_status(path: str | None = None) -> dict[str, Any] | None:
    """The server's own account (``idle``, ``starting``, ``pid``, ``target``, ``given``), or None when none runs."""
    path = path or socket_path()
    sock = _connect(path, start=False) if path else None
    if sock is None:
        return None
    with sock:
        return _request(sock, "status")[0]


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
