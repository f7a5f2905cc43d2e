"""Running the real compilers: NVRTC, nvJitLink and NVVM through cuda.core, nothing cached here.

Two workarounds live here, each explained where it is made: C++ -> PTX without a CUDA driver
(cuda.core asks the driver about PTX it produces), and the reset of NVRTC's time-trace state
after a failed traced compile.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
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


def reset_nvrtc_trace_state(trace_dir: str | None) -> None:
    """Work around an NVRTC bug seen with 13.5: after a compile that FAILS with
    -fdevice-time-trace, the process's next compile without that option still writes a trace,
    to ".json" in the current directory. A successful traced compile clears that state, so
    after a failed one we run a trivial traced compile into our temp dir."""
    from cuda.core import Program, ProgramOptions

    try:
        trace = os.path.join(trace_dir or tempfile.gettempdir(), "reset")
        options = ProgramOptions(arch="sm_90", fdevice_time_trace=trace)
        program = Program(_RESET_SOURCE, "c++", options=options)
        try:
            program.compile("cubin")  # NVRTC alone: no driver needed
        finally:
            program.close()
    except Exception:
        pass  # best effort: the user's own compile error is what gets raised


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
