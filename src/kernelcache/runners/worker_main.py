"""Inside a compiler worker process: load the caller's NVRTC, say so, then run compiles until told to end.

Started by worker.py (spawned, never forked from the caller); nothing here imports the CUDA driver
or creates a context. One compile at a time; each message is one pickled tuple framed by
multiprocessing's Connection: a reader gets a whole message or EOFError, never part of one. The
hello comes first: ready, the pid, the kernelcache imported, and each libnvrtc file mapped with its
identity. Idle for ``idle s``, or idle while a process waits for a slot, it says "bye" and ends.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
from multiprocessing.connection import Connection


def main() -> None:
    """Entry point: ``sys.argv[1:]`` = [sys.path as JSON (already applied), libnvrtc, idle seconds,
    the slots' waiting file ("": none), request fd, reply fd]."""
    argv = sys.argv[1:]
    # Ctrl-C in a terminal reaches the whole process group; it is the caller's to act on (it
    # stops handing out compiles); a worker ends when its request pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inbox, outbox = Connection(int(argv[4]), writable=False), Connection(int(argv[5]), readable=False)
    _end_with_the_parent(inbox.fileno())
    from kernelcache.runners.job import run_job
    from kernelcache.runners.worker import package_dir

    try:
        outbox.send_bytes(pickle.dumps(("ready", os.getpid(), package_dir(), _load_nvrtc(argv[1]))))
        while _next_compile(inbox, float(argv[2]), argv[3]):
            try:
                seq, kind, cwd, env, path, args = pickle.loads(inbox.recv_bytes())
            except EOFError:
                return  # the caller closed the pool, or exited
            outbox.send_bytes(pickle.dumps((seq, *run_job(kind, args, cwd, env, path)), pickle.HIGHEST_PROTOCOL))
        # Idle: end, and free this worker's slot. A compile sent meanwhile is answered "bye":
        # the caller gives it to another worker (worker.Retired), nothing ran here.
        outbox.send_bytes(pickle.dumps(("bye",)))
    except BrokenPipeError:
        return  # the caller let go of this worker (interrupted, or gone): nobody reads the reply


_TICK_S = 0.05  # how often an idle worker looks whether some process waits for a slot


def _next_compile(inbox: Connection, idle_s: float, waiting: str) -> bool:
    """Wait for the next message: True when one came, False when this worker should end (idle
    ``idle_s``, or idle while a process waits for a slot: a lock on ``waiting`` held elsewhere)."""
    import time

    from kernelcache.runners.slots import held_elsewhere

    try:
        fd = os.open(waiting, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600) if waiting else -1
    except OSError:
        fd = -1
    try:
        end = time.monotonic() + idle_s
        while not inbox.poll(min(_TICK_S, max(0.0, end - time.monotonic()))):
            if time.monotonic() >= end or (fd >= 0 and held_elsewhere(fd)):
                return False  # idle long enough, or somebody waits for this worker's slot
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def _load_nvrtc(path: str) -> list[tuple[str, str]]:
    """Load ``path`` before cuda.bindings looks for a libnvrtc (cuda.pathfinder then takes the one
    already loaded), load NVRTC as a compile does, and return every libnvrtc file now mapped, with
    its identity: the proof, checked by the caller before its first compile here."""
    from kernelcache.keys.toolchain import file_identity

    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    from cuda.bindings import nvrtc

    nvrtc.nvrtcVersion()  # loaded now, while the caller is still looking up
    _warm_up(nvrtc)
    mapped = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            name = fields[5].strip() if len(fields) == 6 else ""
            base = os.path.basename(name)
            if base.startswith("libnvrtc.so") and name not in (m for m, _ in mapped):
                try:
                    mapped.append((name, file_identity(name)))
                except OSError as exc:  # a file deleted since: " (deleted)"
                    mapped.append((name, f"unreadable: {exc}"))
    return mapped


def _warm_up(nvrtc: object) -> None:
    """NVRTC's first compile in a process initialises the CUDA driver where there is one (0.1-0.4 s
    of mostly system time on the H200 host, benchmarks/bench_nvrtc_first.py): paid here, before
    the hello, so that a worker is ready when it says so and its first compile costs what the
    others do. A compile of nothing, to the oldest SASS this NVRTC knows, that nothing reads;
    one that fails changes nothing (the first real compile then pays it). Where no driver can
    be loaded it is skipped: there it would initialise nothing and cost a compile (~30 ms on
    this project's 2-core machine, every time)."""
    from kernelcache.runners.compilers import driver_available

    if not driver_available():
        return
    try:
        _, archs = nvrtc.nvrtcGetSupportedArchs()  # type: ignore[attr-defined]
        _, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k() {}', b"warm-up.cu", 0, [], [])  # type: ignore[attr-defined]
        try:
            nvrtc.nvrtcCompileProgram(prog, 1, [f"-arch=sm_{min(archs)}".encode()])  # type: ignore[attr-defined]
        finally:
            nvrtc.nvrtcDestroyProgram(prog)  # type: ignore[attr-defined]
    except Exception:
        pass


def _end_with_the_parent(inbox: int) -> None:
    """End this process the moment nobody can send it a compile any more (the caller exited,
    was killed, or closed its end), also in the middle of a compile, whose result nobody
    would read: the request pipe then hangs up, which poll reports whatever it waits for."""
    import select
    import threading

    def watch() -> None:
        poller = select.poll()
        poller.register(inbox, 0)
        while True:
            for _, event in poller.poll():
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    os._exit(0)

    threading.Thread(target=watch, name="kernelcache-parent-watch", daemon=True).start()
