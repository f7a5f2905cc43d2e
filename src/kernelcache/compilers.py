"""Running the real compilers: NVRTC, nvJitLink and NVVM through cuda.core, nothing cached here.

Two workarounds live here, each explained where it is made: C++ -> PTX without a CUDA driver
(cuda.core asks the driver about PTX it produces), and the reset of NVRTC's time-trace state
after a failed traced compile. So do the trace files themselves: where they go (the store's
own tmp/), when there is no room for one, and when a failed compile was the trace's fault.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions


class LogCollector:
    """A ``logs=`` target for cuda.core: collects what the compiler writes."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts).rstrip("\x00")


def _as_source_text(code: str | bytes) -> str:
    if isinstance(code, str):
        return code
    try:
        return bytes(code).decode("utf-8")
    except UnicodeDecodeError:
        # cuda.core hands NVRTC a str; Latin-1 maps every byte to one character, so the
        # compile sees the same characters (non-ASCII bytes only ever sit in comments or
        # string literals of real sources). The key hashes the original bytes.
        return bytes(code).decode("latin-1")


@functools.cache
def driver_available() -> bool:
    """Whether a CUDA driver library can be loaded in this process (probed once)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _nvrtc_check(result: Any, what: str) -> None:
    from cuda.bindings import nvrtc

    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def _nvrtc_ptx_without_driver(
    code: str, options: ProgramOptions, name_expressions: Sequence[str | bytes], log: LogCollector
) -> ObjectCode:
    """C++ -> PTX with NVRTC alone, for machines with no driver.

    cuda.core 1.2's Program.compile("ptx") asks the driver whether the PTX can be loaded and
    raises where there is none; PTX generation itself never needed a driver.
    """
    from cuda.bindings import nvrtc
    from cuda.core import ObjectCode

    name = (options.name or "default_program").encode()
    err, prog = nvrtc.nvrtcCreateProgram(code.encode("utf-8"), name, 0, [], [])
    _nvrtc_check(err, "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            raw = expr if isinstance(expr, bytes) else expr.encode()
            _nvrtc_check(nvrtc.nvrtcAddNameExpression(prog, raw), "nvrtcAddNameExpression")
        flags = options.as_bytes("nvrtc")
        result = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        # Output buffers are fresh bytearrays: NVRTC writes into them in place, and a bytes
        # object such as b" " * 1 is an interpreter-wide singleton it would corrupt.
        err_log, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log.write(bytes(buf).decode(errors="replace"))
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            from cuda.core._utils.cuda_utils import NVRTCError  # the error cuda.core raises

            raise NVRTCError(f"{result[0]}: compile of {name.decode()} failed:\n{log.text()}")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _nvrtc_check(err, "nvrtcGetPTXSize")
        ptx = bytearray(size)
        _nvrtc_check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        mapping = {}
        for expr in name_expressions:
            raw = expr if isinstance(expr, bytes) else expr.encode()
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, raw)
            _nvrtc_check(err, "nvrtcGetLoweredName")
            mapping[expr] = lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return ObjectCode.from_ptx(bytes(ptx).rstrip(b"\x00"), name=options.name or "", symbol_mapping=mapping)


_RESET_SOURCE = 'extern "C" __global__ void kernelcache_trace_reset() {}\n'

# NVRTC aborts the whole process (SIGABRT, "LLVM ERROR: out of memory" or "Could not open
# ...") when it cannot write its trace, e.g. on a full disk. A trace is only written where
# at least this much room is left; most traces are tens of KB, a CUB kernel's a few MB.
TRACE_ROOM_BYTES = 64 << 20
TRACE_PREFIX = "kernelcache-trace-"


def new_trace_path(tmp_dir: str | None) -> str | None:
    """A fresh trace name in ``tmp_dir`` (the store's own tmp/; the system temp dir when the
    store has none); None when that filesystem has no room for a trace.

    NVRTC writes ``<name>.json`` at the end of the compile (ptxas reopens and extends it),
    and merges into a file that is already there, so every compile gets a new name.
    """
    where = tmp_dir or tempfile.gettempdir()
    try:
        # The store recreates tmp/ when someone deleted it; so do we, since NVRTC aborts
        # on a missing directory. Race: a tmp/ removed during the compile (rm -rf of the
        # whole cache) still aborts it; kernelcache's own sweeps remove files only, and
        # only old ones, and the trace exists only in the compile's last moments.
        os.makedirs(where, mode=0o700, exist_ok=True)
        st = os.statvfs(where)
    except OSError:
        return None
    # Race: another writer can fill the disk between this check and NVRTC's write; the
    # margin is what makes that unlikely, not impossible.
    if st.f_bavail * st.f_frsize < TRACE_ROOM_BYTES:
        return None
    return os.path.join(where, f"{TRACE_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")


def remove_trace(path: str) -> None:
    """Remove what NVRTC wrote for ``path`` (either spelling), if anything."""
    for name in (path + ".json", path):
        try:
            os.unlink(name)
        except OSError:
            pass


def lost_trace(exc: BaseException, trace_path: str) -> bool:
    """Whether a traced compile failed because of its trace (not because of the source).

    ptxas reopens the trace NVVM wrote: if something removed or rewrote it meanwhile,
    ptxas fails the whole compile ("ptxas fatal : File '<trace>.json' could not be opened",
    "Parsed trace file not in expected format"). An NVRTC without the option names it.
    """
    text = str(exc)
    return trace_path in text or "trace file" in text or "time-trace" in text


def reset_nvrtc_trace_state(tmp_dir: str | None) -> None:
    """Work around an NVRTC bug seen with 13.5: after a compile that FAILS with
    -fdevice-time-trace, the process's next compile without that option still writes a trace,
    to ".json" in the current directory. A successful traced compile clears that state, so
    after a failed one we run a trivial traced compile into our temp dir."""
    from cuda.core import Program, ProgramOptions

    trace = new_trace_path(tmp_dir)
    if trace is None:
        return  # no room: a trace that cannot be written would abort the process
    try:
        options = ProgramOptions(arch="sm_90", fdevice_time_trace=trace)
        program = Program(_RESET_SOURCE, "c++", options=options)
        try:
            program.compile("cubin")  # NVRTC alone: no driver needed
        finally:
            program.close()
    except Exception:
        pass  # best effort: the user's own compile error is what gets raised
    finally:
        remove_trace(trace)


def run_compiler(
    code: str | bytes,
    code_type: str,
    target_type: str,
    options: ProgramOptions,
    name_expressions: Sequence[str | bytes],
    trace_path: str | None,
) -> tuple[ObjectCode, str, float]:
    """Compile with the real compiler; return (object code, log text, seconds).

    ``trace_path``: where NVRTC writes its -fdevice-time-trace (the headers it read), or None.
    """
    from cuda.core import Program

    log = LogCollector()
    start = time.perf_counter()
    if trace_path is not None:
        options = dataclasses.replace(options, fdevice_time_trace=trace_path)
    source: str | bytes = code if code_type == "nvvm" else _as_source_text(code)
    if code_type == "c++" and target_type == "ptx" and not driver_available():
        obj = _nvrtc_ptx_without_driver(str(source), options, name_expressions, log)
    else:
        program = Program(source, code_type, options=options)
        try:
            obj = program.compile(target_type, name_expressions=tuple(name_expressions), logs=log)
        finally:
            program.close()
    return obj, log.text(), time.perf_counter() - start
