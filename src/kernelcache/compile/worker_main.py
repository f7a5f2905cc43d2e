"""Inside a compiler worker process: read a compile from the parent, run it, send the result.

workers.py starts this as ``python -c <boot> <sys.path> <in fd> <out fd>`` (spawned, never
forked from the caller). Nothing here imports the CUDA driver or creates a context: a direct
NVRTC compile needs cuda.bindings' NVRTC alone; cuda.core is imported only for a compile that
goes through its Program (debug, lineinfo, PCH), which for C++ -> cubin/LTO-IR needs no driver.

One compile at a time, in the order received. Each message is one pickled tuple, framed by
multiprocessing's Connection (a length, then the bytes): a reader gets a whole message or
EOFError, never part of one. The first thing the worker sends is worker_proc.hello(), after its
imports: a worker that dies before that never started (see WorkerPool in workers.py).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import warnings
from multiprocessing.connection import Connection
from typing import Any


class NvrtcFailed(Exception):
    """An NVRTC call failed; the text is that of cuda.core's NVRTCError (the parent raises that)."""


def main() -> None:
    """Entry point: ``sys.argv[1:]`` = [sys.path as JSON (already applied), request fd, reply fd]."""
    argv = sys.argv[1:]
    # Ctrl-C in a terminal reaches the whole process group; it is the parent's to act on
    # (it stops handing out compiles); a worker ends when its request pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inbox, outbox = Connection(int(argv[1]), writable=False), Connection(int(argv[2]), readable=False)
    _end_with_the_parent(inbox.fileno())
    from cuda.bindings import nvrtc

    nvrtc.nvrtcVersion()  # load libnvrtc now, while the parent is still looking up
    try:
        from kernelcache.compile.worker_proc import hello

        outbox.send_bytes(pickle.dumps(hello(os.getpid())))
        while True:
            try:
                message = pickle.loads(inbox.recv_bytes())
            except EOFError:
                return  # the parent closed the pool, or exited
            outbox.send_bytes(pickle.dumps(answer(message), pickle.HIGHEST_PROTOCOL))
    except BrokenPipeError:
        return  # the parent let go of this worker (interrupted, or gone): nobody reads the reply


def _end_with_the_parent(inbox: int) -> None:
    """End this process the moment nobody can send it a compile any more (the parent exited,
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


def answer(message: tuple[Any, ...]) -> tuple[Any, ...]:
    """One compile: ``(seq, kind, cwd, env, sys.path, args)`` -> ``(seq, outcome, value, warnings)``."""
    seq, kind, cwd, env, path, pickled = message
    if kind == "warm":
        return seq, "warm", _warm_up(), []
    _take_on(cwd, env, path)  # first: the arguments may name the caller's own modules
    try:
        args = pickle.loads(pickled)
    except Exception as exc:  # a class the parent has and this interpreter cannot import
        return seq, "unreadable", f"{type(exc).__name__}: {exc}", []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the parent's filters decide what is shown
        try:
            outcome, value = _nvrtc(*args) if kind == "nvrtc" else _program(*args)
        except Exception as exc:
            outcome, value = "error", _picklable(exc)
    # Warning categories travel by name: the parent resolves them (UserWarning if it cannot).
    shown = [(w.category.__module__, w.category.__qualname__, str(w.message)) for w in caught]
    return seq, outcome, value, shown


def _warm_up() -> float:
    """One small compile, the compile server's (server.py) before it hands this worker over:
    NVRTC loads and initialises the CUDA driver in a process's first compile (~0.2 s on a GPU
    host), which this pays now. No option that NVRTC keeps for later compiles (--restrict), no
    trace; its output is dropped. Returns its seconds."""
    from cuda.bindings import nvrtc

    start = time.perf_counter()
    source = b'extern "C" __global__ void kernelcache_warm_up() {}'
    err, prog = nvrtc.nvrtcCreateProgram(source, b"warm_up.cu", 0, [], [])
    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        nvrtc.nvrtcCompileProgram(prog, 0, [])
        nvrtc.nvrtcDestroyProgram(prog)
    return time.perf_counter() - start


def _take_on(cwd: str | None, env: dict[str, str], path: list[str]) -> None:
    """The caller's working directory, environment and sys.path, as they are at this compile:
    quoted includes and relative include paths are read from the cwd, the compilers read
    variables at compile time, and what this worker imports from now on (the caller's classes
    in the arguments, what a compiler imports late) is found where the caller finds it: a
    worker of the compile server started without the directories of sys.path that hold
    nothing it imports at its start (fingerprint.server_sys_path). ``cwd`` None: the caller's
    was deleted; so is ours then (a fresh empty directory, removed), so that nothing resolves
    relative to it, as there."""
    if sys.path != path:
        sys.path[:] = path
    try:
        here: str | None = os.getcwd()
    except OSError:
        here = None
    if cwd is None and here is not None:
        import tempfile

        gone = tempfile.mkdtemp(prefix="kernelcache-cwd-")
        os.chdir(gone)
        os.rmdir(gone)
    elif cwd is not None and here != cwd:
        os.chdir(cwd)
    if env != os.environ:
        for name in [n for n in os.environ if n not in env]:
            del os.environ[name]
        os.environ.update(env)


def _nvrtc(call: Any, trace_dir: str | None) -> tuple[str, Any]:
    from kernelcache.compile.compilers import LogCollector, reset_nvrtc_trace_state

    log = LogCollector()
    start = time.perf_counter()
    try:
        data, mapping = call.run(log, NvrtcFailed)
    except NvrtcFailed as exc:
        if trace_dir is not None:
            reset_nvrtc_trace_state(trace_dir)  # this process compiles next: reset it here
        return "nvrtc-error", str(exc)
    return "ok", (data, mapping, log.text(), time.perf_counter() - start)


def _program(request: Any, trace: str | None) -> tuple[str, Any]:
    from kernelcache.compile.compilers import reset_nvrtc_trace_state, run_compiler

    try:
        return "object", run_compiler(request, trace)
    except Exception:
        if trace is not None:
            reset_nvrtc_trace_state(os.path.dirname(trace))
        raise


def _picklable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a RuntimeError naming its type and text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}")
