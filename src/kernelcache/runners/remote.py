"""Compiles handed to a ``concurrent.futures.Executor`` (``warm --executor``): a Dask cluster's
workers (``Client.get_executor()``), a ProcessPoolExecutor, Ray's adaptors.

Each compile is one task: ``kernelcache_compile``, a top-level function of plain picklable values,
runs job.run_job (the very compile a compiler worker runs: no second copy) in the executor's
process, which needs kernelcache and the CUDA wheels but no GPU. Everything else stays in the
caller: the key, the single flight, the header variant, the store (so the keys are those a local
``warm`` gives). What a worker did is checked before anything is stored:
- its toolchain (keys.toolchain: cuda-core/cuda-bindings and the NVRTC build it compiled with) must be
  the caller's, whose identity the key records; another build's result is refused (ForeignWorker);
- a traced compile's header trace comes back as bytes with the digest of every header the worker read;
  a header whose content differs from the caller's file at that path refuses the result too.
C++ compiles go to the executor, but ``restrict=True`` ones (NVRTC keeps ``--restrict`` on for the
rest of the process that ran one: never a shared worker's) and NVVM / PTX input, which run here.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from typing import Any

from kernelcache.runners import compilers

__all__ = ["IN_FLIGHT", "ForeignWorker", "OnExecutor", "compiled_here", "executor_for", "kernelcache_compile"]

# Tasks in flight at most, one caller thread waiting on each: the executor queues them and its own
# scheduler places them (kernelcache schedules nothing); more than a cluster's slots keeps it busy.
IN_FLIGHT = 256
_one_at_a_time = threading.Lock()  # the working directory and environment are the process's
COMPILED = collections.Counter()  # in a worker process: outcome -> compiles it ran for an executor


class ForeignWorker(RuntimeError):
    """A worker compiled with another toolchain, or read other headers, than the caller has:
    its result is refused (never stored under the caller's key)."""


def _overrides() -> dict[str, str | None]:
    """The caller's environment variables that change a compile's output (keys.derive's), and PWD
    (-G, -lineinfo and LTO-IR name it): a worker compiles with these, its own environment otherwise."""
    from kernelcache.keys.derive import OUTPUT_VARIABLES

    return {name: os.environ.get(name) for name in (*OUTPUT_VARIABLES, "PWD")}


def kernelcache_compile(
    kind: str,
    args: tuple[Any, ...],
    cwd: str | None,
    cwd_empty: bool,
    overrides: dict[str, str | None],
    traced: bool,
) -> dict[str, Any]:
    """In the executor's process: job.run_job of one compile, in the caller's working directory
    ``cwd`` (None: it was deleted; one this host lacks while the caller's is empty: a deleted one
    too, which resolves nothing, as an empty one) with the caller's ``overrides`` of the environment.
    Returns the reply (outcome, value, warnings), where it ran, its toolchain, and for ``traced``
    the header trace and its digests.
    The process's directory and environment are restored after it; compiles in one process run
    one at a time (Race: two threads of one Dask worker would change each other's directory; the
    worker's own threads see the caller's directory and variables during a compile: Dask's use
    absolute paths, and the variables changed are the compilers' alone)."""
    import pickle

    from kernelcache.keys import toolchain
    from kernelcache.runners.job import run_job, take_on
    from kernelcache.runners.worker import environ_copy

    where = f"{socket.gethostname()}:{os.getpid()}"
    caller_cwd = cwd
    if cwd is not None and not os.path.isdir(cwd):
        if not cwd_empty:
            why = f"the working directory {cwd} is not on worker {where} (headers found through it would differ)"
            return {"reply": ("error", ForeignWorker(why), []), "where": where}
        cwd = None
    trace_dir = tempfile.mkdtemp(prefix="kernelcache-remote-") if traced else None
    trace = compilers.new_trace_path(trace_dir) if trace_dir else None
    if kind == "nvrtc":
        import dataclasses

        args = (dataclasses.replace(args[0], trace=trace), trace_dir)
    else:
        args = (args[0], trace)
    with _one_at_a_time:
        saved_env, saved_path = environ_copy(), list(sys.path)
        try:
            saved_cwd: str | None = os.getcwd()
        except OSError:
            saved_cwd = None
        env = {**saved_env, **{k: v for k, v in overrides.items() if v is not None}}
        for name in [k for k, v in overrides.items() if v is None]:
            env.pop(name, None)
        try:
            reply = run_job(kind, pickle.dumps(args, pickle.HIGHEST_PROTOCOL), cwd, env, saved_path)
        finally:
            take_on(saved_cwd or "/", saved_env, saved_path)
    COMPILED[reply[0]] += 1
    loaded = toolchain.loaded_file("nvrtc")
    used = {
        "cuda_core": toolchain.cuda_core_identity(),
        "compiler": toolchain.file_identity(loaded) if loaded else "no libnvrtc loaded",
    }
    out: dict[str, Any] = {"reply": reply, "where": where, "toolchain": used}
    if trace_dir is not None:  # no trace where there was no room for one: the caller does not store it
        out["trace"], out["headers"] = _trace_and_digests(trace, caller_cwd) if trace else (None, {})
        shutil.rmtree(trace_dir, ignore_errors=True)
    return out


def _trace_and_digests(trace: str, cwd: str | None) -> tuple[bytes | None, dict[str, str | None]]:
    """The trace NVRTC wrote (None: none) and the digest of each header it lists, as read here
    (a relative name resolved against the caller's ``cwd``, as the caller resolves it)."""
    from kernelcache.headers import digests as hdr

    data = None
    for name in (trace + ".json", trace):
        try:
            with open(name, "rb") as f:
                data = f.read()
            break
        except OSError:
            continue
    found, _ = hdr.headers_from_trace(trace, cwd or "/")
    return data, {path: hdr.file_digest(path) for path in found or ()}


def compiled_here() -> dict[str, int]:
    """In a worker process: how many compiles it ran for an executor, by outcome ("ok", "object", ...)."""
    return dict(COMPILED)


class OnExecutor:
    """A runner (runners.choice) whose C++ compiles are tasks of ``executor``; ``on_refused(why)``
    is called for each result refused (ForeignWorker; warm counts it in the store)."""

    def __init__(self, executor: Executor, on_refused: Any = None) -> None:
        if not callable(getattr(executor, "submit", None)):
            raise TypeError(f"executor must be a concurrent.futures.Executor, not {type(executor).__name__}")
        self.executor = executor
        self._on_refused = on_refused

    def takes(self, request: Any) -> bool:
        """Whether this compile goes to the executor (C++, never ``restrict=True``)."""
        return request.code_type == "c++" and not getattr(request.options, "restrict", False)

    def run_compiler(
        self,
        request: Any,
        trace_path: str | None,
        traced: Callable[[], None] | None = None,
        *,
        started: Callable[[], None] | None = None,
    ) -> tuple[Any, str, float]:
        """``traced`` is never called: the trace comes back with the compile's result."""
        from kernelcache.keys.toolchain import toolchain_for
        from kernelcache.runners.choice import result_of_reply

        # PTX as a worker makes it (a direct NVRTC call: no driver there); bytes as any compile's.
        _, _, call = compilers.plan_compile(request, None, direct_ptx=True)
        kind, args = ("nvrtc", (call, None)) if call is not None else ("program", (request, None))
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None
        traced = trace_path is not None
        try:
            empty = cwd is None or not os.listdir(cwd)
        except OSError:
            empty = False  # unreadable here: a worker without it must not compile as if it were empty
        if started is not None:
            started()  # this thread only waits from here on
        # Positional arguments only: Dask's executor takes keyword arguments as its own.
        got = self.executor.submit(kernelcache_compile, kind, args, cwd, empty, _overrides(), traced).result()
        outcome = got["reply"][0]
        if outcome in ("ok", "object"):
            mine = toolchain_for(request.code_type).as_dict()
            if got["toolchain"] != mine:
                self._refuse(f"worker {got['where']} compiled with {got['toolchain']}, not this process's {mine}")
            if traced:
                self._take_trace(got, trace_path, cwd)  # type: ignore[arg-type]
        return result_of_reply(call, *got["reply"])

    def _take_trace(self, got: dict[str, Any], trace_path: str, cwd: str | None) -> None:
        """Write the worker's trace where the flow reads it; refuse a header read with other content."""
        from kernelcache.headers import digests as hdr

        if got.get("trace") is None:
            return  # no trace: the flow does not store the result (tracing.HeaderTrace.variant)
        with open(trace_path + ".json", "wb") as f:
            f.write(got["trace"])
        found, _ = hdr.headers_from_trace(trace_path, cwd or "/")
        for path in found or ():
            if hdr.file_digest(path) != got["headers"].get(path):
                compilers.remove_trace(trace_path)
                self._refuse(f"worker {got['where']} read {path} with other content than this host's")

    def _refuse(self, why: str) -> None:
        if self._on_refused is not None:
            self._on_refused(why)
        raise ForeignWorker(f"the result is refused: {why}")


@contextlib.contextmanager
def executor_for(spec: str) -> Iterator[Executor]:
    """The executor ``warm --executor SPEC`` names: ``dask://HOST:PORT``, a Dask scheduler (its
    client closed at the end). ValueError for any other value, ImportError naming the extra to
    install where Dask's client is missing, OSError where the scheduler cannot be reached: at once,
    before anything compiles."""
    scheme, sep, address = spec.partition("://")
    host, colon, port = address.rpartition(":")
    if not sep or scheme != "dask" or not colon or not host or not port.isdigit() or "/" in address:
        raise ValueError(
            f"--executor takes dask://HOST:PORT (a Dask scheduler's address), not {spec!r}; any other "
            "concurrent.futures.Executor (a ProcessPoolExecutor, Ray's) goes to kernelcache.warm(executor=...)"
        )
    try:
        from distributed import Client
    except ImportError as exc:
        raise ImportError(
            f"--executor {spec} needs Dask's client (distributed): pip install 'kernelcache[dask]' ({exc})"
        ) from None
    try:
        client = Client(f"tcp://{address}", timeout=CONNECT_S, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise OSError(f"--executor {spec}: the Dask scheduler cannot be reached ({exc})") from None
    try:
        try:  # a scheduler without workers would queue every compile forever
            client.wait_for_workers(1, timeout=CONNECT_S)
        except (OSError, TimeoutError) as exc:
            raise OSError(f"--executor {spec}: the Dask scheduler has no workers ({exc})") from None
        yield client.get_executor(pure=False)  # each compile a task of its own (a key of its own)
    finally:
        client.close()


CONNECT_S = 10.0  # how long warm waits for the Dask scheduler to answer


def _reset_in_child() -> None:
    global _one_at_a_time
    _one_at_a_time = threading.Lock()  # another thread's compile runs in the parent, not here


from kernelcache import forksafe  # noqa: E402 - registered once the lock exists

forksafe.reset_function_in_child(_reset_in_child)
