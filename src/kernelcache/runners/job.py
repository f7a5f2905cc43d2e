"""The one compile a process runs for another: what a compiler worker runs, and what a Dask worker
will run for ``warm --executor``. ``run_job`` is a plain top-level function of picklable values:
a request in (its kind and pickled arguments; the caller's working directory, environment and
sys.path of that moment), the artifact, log and warnings out, or the error the same compile
raises in the caller. It never touches a store. Kind "nvrtc": a compilers.NvrtcCall (needs
cuda.bindings' NVRTC alone); "program": (request, trace path) through cuda.core's Program
(debug, lineinfo, PCH), which for C++ needs no CUDA driver either.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import warnings
from typing import Any

__all__ = ["NvrtcFailed", "run_job"]


class NvrtcFailed(Exception):
    """An NVRTC call failed; the text is that of cuda.core's NVRTCError (the caller raises that)."""


def run_job(kind: str, pickled: bytes, cwd: str | None, env: dict[str, str], path: list[str]) -> tuple[Any, ...]:
    """One compile, as the caller would run it: ``(outcome, value, warnings)``.

    outcome "ok": value = (data, symbol mapping, log, seconds); "object": an ObjectCode (kind
    "program"); "nvrtc-error": cuda.core's NVRTCError text; "error": the exception; "unreadable":
    the arguments name something this interpreter cannot import (value: why)."""
    take_on(cwd, env, path)  # first: the arguments may name the caller's own modules
    try:
        args = pickle.loads(pickled)
    except Exception as exc:  # a class the caller has and this interpreter cannot import
        return "unreadable", f"{type(exc).__name__}: {exc}", []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the caller's filters decide what is shown
        try:
            outcome, value = _nvrtc(*args) if kind == "nvrtc" else _program(*args)
        except Exception as exc:
            outcome, value = "error", _picklable(exc)
    # Warning categories travel by name: the caller resolves them (UserWarning if it cannot).
    shown = [(w.category.__module__, w.category.__qualname__, str(w.message)) for w in caught]
    return outcome, value, shown


def take_on(cwd: str | None, env: dict[str, str], path: list[str]) -> None:
    """The caller's working directory, environment and sys.path, as they are at this compile:
    quoted includes and relative include paths are read from the cwd, the compilers read
    variables at compile time, and what this process imports from now on (the caller's classes
    in the arguments, what a compiler imports late) is found where the caller finds it.
    ``cwd`` None: the caller's was deleted; so is ours then (a fresh empty directory, removed),
    so that nothing resolves relative to it, as there."""
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
    from kernelcache.runners.compilers import LogCollector, reset_nvrtc_trace_state

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
    from kernelcache.runners.compilers import reset_nvrtc_trace_state, run_compiler

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
