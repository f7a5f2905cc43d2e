"""Running the real compilers: NVRTC, nvJitLink and NVVM, nothing cached here.

C++ -> cubin and LTO-IR run on NVRTC through cuda.bindings, exactly as cuda.core's Program
would run them, so that compiles on threads run at once (see _nvrtc_directly); everything
else goes through cuda.core. Two workarounds live here, each explained where it is made:
C++ -> PTX without a CUDA driver (cuda.core asks the driver about PTX it produces), and the
reset of NVRTC's time-trace state after a failed traced compile. So does the header pass
(which headers a compile read: header_pass) and its trace files (in the store's tmp/, if room).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.keys.program_name import compiled_name

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions

# A CompileRequest (compile/request.py, above this folder): code, code_type, target_type,
# options, name_expressions.
CompileRequest = Any


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


# Options for which cuda.core's Program does more than hand ``options.as_bytes("nvrtc")`` to
# NVRTC: with debug or lineinfo it writes the source to a temp file and compiles under that
# name (the name ends up in the cubin), the PCH options get a status and a retry with a bigger
# heap, and the rest are refused or handled by other backends. Those compiles go through it.
_THROUGH_CUDA_CORE = (
    "debug",
    "lineinfo",
    "pch",
    "create_pch",
    "use_pch",
    "pch_dir",
    "pch_verbose",
    "pch_messages",
    "instantiate_templates_in_pch",
    "extra_sources",
    "use_libdevice",
    "numba_debug",
)
_OUTPUT = {
    "ptx": ("nvrtcGetPTXSize", "nvrtcGetPTX", "from_ptx"),
    "cubin": ("nvrtcGetCUBINSize", "nvrtcGetCUBIN", "from_cubin"),
    "ltoir": ("nvrtcGetLTOIRSize", "nvrtcGetLTOIR", "from_ltoir"),
}


def _nvrtc_check(err: Any, prog: Any = None, error: type[Exception] | None = None) -> None:
    """Raise cuda.core's NVRTCError (or ``error``), in cuda.core's words, for a failed NVRTC call.

    The message is cuda.core's ("6: NVRTC_ERROR_COMPILATION, compilation log:\\n\\n<log>");
    its own check is not called because it reads the log into ``b" " * size``: for an empty
    log (size 1) that is the interpreter's shared b" ", which NVRTC then overwrites.
    """
    from cuda.bindings import nvrtc

    if err == nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return
    if error is None:
        from cuda.core._utils.cuda_utils import NVRTCError as error

    text = f"{int(err)}: {nvrtc.nvrtcGetErrorString(err)[1].decode()}"
    if prog is not None:
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        text += f", compilation log:\n\n{buf.decode('utf-8', errors='backslashreplace')}"
    raise error(text)


def nvrtc_argv(options: Any) -> tuple[str, ...] | None:
    """The verbatim command line ``options`` carry (compile/nvrtc_argv.py makes such options), or
    None for ordinary ProgramOptions."""
    argv = getattr(options, "nvrtc_argv", None)
    return argv if isinstance(argv, tuple) else None


def _nvrtc_directly(code_type: str, target_type: str, options: Any) -> bool:
    """Whether a compile runs on NVRTC here, the way cuda.core's Program would run it.

    Why: compile_many needs compiles on threads to run at once. Issue 14 measured cuda.core's
    Program.compile (1.2) not doing so on the H200 host; this path puts nothing between the
    threads and NVRTC but cuda.bindings, whose calls release the GIL (benchmarks/
    bench_parallel.py shows, per host, which layer runs in parallel). PTX is left to
    cuda.core where a driver exists: it asks the driver whether it can load the PTX and
    warns when not.
    """
    if code_type == "c++" and target_type in _OUTPUT and nvrtc_argv(options) is not None:
        return True  # a verbatim command line (CuPy's): only this path hands NVRTC exactly it
    if code_type != "c++" or target_type not in ("cubin", "ltoir"):
        return False
    from cuda.core import ProgramOptions

    if not isinstance(options, ProgramOptions) or not isinstance(getattr(options, "_name", None), bytes):
        return False
    return all(getattr(options, field, None) is None for field in _THROUGH_CUDA_CORE)


def nvrtc_compile(
    code: str,
    target_type: str,
    options: ProgramOptions,
    name_expressions: Sequence[str | bytes],
    log: LogCollector,
) -> ObjectCode:
    """C++ -> ``target_type`` on NVRTC through cuda.bindings: cuda.core's Program.compile, step
    for step (same calls, flags, program name, lowered names, log, ObjectCode and NVRTCError),
    minus its serialisation. Tests: test_nvrtc_direct.py compares the bytes with cuda.core's.
    """
    flags = tuple(options.as_bytes("nvrtc", target_type))
    call = NvrtcCall(code, options._name, flags, target_type, tuple(name_expressions), options.name)  # type: ignore[attr-defined]
    return call.object_code(*call.run(log))


def nvrtc_run(
    code: str,
    program_name: bytes,
    flags: Sequence[bytes],
    target_type: str,
    name_expressions: Sequence[str | bytes],
    log: LogCollector,
    error: type[Exception] | None = None,
    started: Callable[[], None] | None = None,
) -> tuple[bytes, dict[str | bytes, bytes | None]]:
    """nvrtc_compile's NVRTC calls alone: (output bytes, symbol mapping), nothing of cuda.core
    imported unless a call fails and ``error`` is None (then NVRTCError is raised).
    ``started``: called right before nvrtcCompileProgram, which releases the GIL for the compile."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(code.encode(), program_name, 0, [], [])
    _nvrtc_check(err, None, error)
    try:
        for expr in name_expressions:
            added = nvrtc.nvrtcAddNameExpression(prog, expr.encode() if isinstance(expr, str) else expr)
            _nvrtc_check(added[0], prog, error)
        if started is not None:
            started()
        # The compile itself releases the GIL: this is what runs on all cores.
        _nvrtc_check(nvrtc.nvrtcCompileProgram(prog, len(flags), list(flags))[0], prog, error)
        data = bytearray()
        if target_type in _OUTPUT:  # else the header pass: no output
            size_of, get, _ = _OUTPUT[target_type]
            err, size = getattr(nvrtc, size_of)(prog)
            _nvrtc_check(err, prog, error)
            # Output buffers are fresh bytearrays: NVRTC writes into them in place, and a bytes
            # object such as b" " * 1 is an interpreter-wide singleton it would corrupt.
            data = bytearray(size)
            _nvrtc_check(getattr(nvrtc, get)(prog, data)[0], prog, error)
        mapping: dict[str | bytes, bytes | None] = {}
        for expr in name_expressions:
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, expr.encode() if isinstance(expr, str) else expr)
            _nvrtc_check(err, prog, error)
            mapping[expr] = lowered
        err, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        _nvrtc_check(err, prog, error)
        if log_size > 1:  # as cuda.core: a log of just its NUL is no log
            buf = bytearray(log_size)
            _nvrtc_check(nvrtc.nvrtcGetProgramLog(prog, buf)[0], prog, error)
            log.write(buf.decode("utf-8", errors="backslashreplace"))
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return bytes(data), mapping


@dataclasses.dataclass(frozen=True)
class NvrtcCall:
    """One compile as the NVRTC calls it is made of: all that a process needs to run it with
    cuda.bindings alone (a compiler worker imports nothing of cuda.core for it)."""

    source: str
    program_name: bytes  # what cuda.core names the NVRTC program: the bytes ProgramOptions encoded
    flags: tuple[bytes, ...]
    target_type: str
    name_expressions: tuple[str | bytes, ...]
    name: str | None  # the ObjectCode's name
    trace: str | None = None  # where the header pass writes its trace, after the compile (None: no pass)

    def run(
        self, log: LogCollector, error: type[Exception] | None = None, started: Callable[[], None] | None = None
    ) -> tuple[bytes, dict[str | bytes, bytes | None]]:
        """(output bytes, symbol mapping); NVRTCError (or ``error``) in cuda.core's words.
        With ``trace``, the header pass runs once the compile succeeded (header_pass).
        ``started``: called right before NVRTC's compile (nvrtc_run)."""
        args = (self.source, self.program_name, self.flags, self.target_type, self.name_expressions)
        out = nvrtc_run(*args, log, error, started)
        if self.trace is not None:
            header_pass(self.source, self.program_name, self.flags, self.trace)
        return out

    def object_code(self, data: bytes, mapping: dict[str | bytes, bytes | None]) -> ObjectCode:
        from cuda.core import ObjectCode

        make = getattr(ObjectCode, _OUTPUT[self.target_type][2])
        return make(data, name=self.name, symbol_mapping=mapping)  # type: ignore[no-any-return]


def plan_compile(
    request: CompileRequest, trace_path: str | None, direct_ptx: bool = False
) -> tuple[str | bytes, ProgramOptions, NvrtcCall | None]:
    """What run_compiler hands the compiler: (source, options, the direct NVRTC call, or None
    where cuda.core's Program compiles it). The compile itself never carries the trace
    (``trace_path`` is for the header pass after it, header_pass): it is the caller's own.

    C++ -> PTX is a direct call where this process has no driver (cuda.core 1.2's
    Program.compile("ptx") asks the driver whether it can load the PTX, and raises without
    one) or with ``direct_ptx`` (a worker, which never loads the driver). Its PTX is NVRTC's
    whole buffer, terminating NUL included, as cuda.core's Program returns it with a driver:
    one form of the bytes under one key, wherever it was compiled.
    """
    code, code_type, target_type, options = request.code, request.code_type, request.target_type, request.options
    source: str | bytes = code if code_type == "nvvm" else _as_source_text(code)
    ptx = code_type == "c++" and target_type == "ptx"
    if (ptx and (direct_ptx or not driver_available())) or _nvrtc_directly(code_type, target_type, options):
        call = NvrtcCall(
            str(source),
            options._name,  # type: ignore[attr-defined]
            tuple(options.as_bytes("nvrtc", target_type)),
            target_type,
            request.name_expressions,
            compiled_name(options, "c++"),
            trace_path,
        )
        return source, options, call
    return source, options, None


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


def reset_nvrtc_trace_state(tmp_dir: str | None) -> None:
    """Work around an NVRTC bug seen with 13.5: after a compile that FAILS with
    -fdevice-time-trace, the process's next compile without that option still writes a trace,
    to ".json" in the current directory. A successful traced compile clears that state, so
    after a failed one we run a trivial traced compile into our temp dir.

    Race: compiles run on several threads at once (compile_many). The state is per thread
    (LLVM's time-trace profiler is thread_local; measured: another thread's untraced compile
    writes no ".json"), and this reset runs on the thread that failed before that thread
    compiles again. Test: test_failed_traced_compiles_on_threads_leave_no_stray_trace."""
    trace = new_trace_path(tmp_dir)
    if trace is None:
        return  # no room: a trace that cannot be written would abort the process
    try:
        # What ProgramOptions(arch="sm_90", fdevice_time_trace=trace) hands NVRTC; NVRTC alone,
        # no driver and no cuda.core needed (compiler workers run this too).
        flags = [b"-arch=sm_90", b"--fdevice-time-trace=" + os.fsencode(trace)]
        nvrtc_run(_RESET_SOURCE, b"default_program", flags, "cubin", (), LogCollector(), RuntimeError)
    except Exception:
        pass  # best effort: the user's own compile error is what gets raised
    finally:
        remove_trace(trace)


# Flags the header pass leaves out: a trace of the user's own (kernelcache refuses one in the
# options; a verbatim command line could hold it) and the PCH options, which write or read a
# precompiled header file (a pass without them reads every header itself: a superset).
_NOT_IN_HEADER_PASS = (
    b"--fdevice-time-trace",
    b"-fdevice-time-trace",
    b"--create-pch",
    b"--use-pch",
    b"--pch",
    b"-pch",
    b"--pch-dir",
    b"--instantiate-templates-in-pch",
)
HEADER_PASS_FLAGS = (b"--fdevice-syntax-only",)


def header_pass(source: str, program_name: bytes, flags: Sequence[bytes], trace_path: str) -> bool:
    """Run NVRTC's front end alone over the compile just made, writing the headers it reads to
    ``trace_path`` (``-fdevice-time-trace``); True when it succeeded.

    Why a pass of its own: NVRTC 13 has no dependency output (-M, -MD, -MF are unknown
    options), and a compile that carries ``-fdevice-time-trace`` generates other code for
    some sources (measured with NVRTC 13.5: other register numbering and instruction order),
    so the compile that is stored is the plain one and the trace comes from this pass, which
    generates no code (``--fdevice-syntax-only``). Same source, program name and flags:
    the same preprocessing, hence the same headers.

    Why after the compile, never before or beside it: after one traced compile that fails,
    NVRTC drops the first header events of every later trace in the process, on every
    thread (measured with 13.5; untraced failures leave no such state). The compile ran
    first and succeeded, so this pass succeeds too, unless a header changed in between; the
    flow then does not store the result (the digests differ), and the trace this pass lost
    is reported by headers.digests.headers_from_trace as unusable.
    """
    try:
        nvrtc_run(source, program_name, header_pass_flags(flags, trace_path), "none", (), LogCollector(), RuntimeError)
        return True
    except Exception:
        reset_nvrtc_trace_state(os.path.dirname(trace_path))  # see reset_nvrtc_trace_state
        remove_trace(trace_path)  # a failed pass's trace is never read
        return False


def header_pass_args(
    source: str | bytes, options: ProgramOptions, target_type: str, trace_path: str
) -> tuple[str, bytes, tuple[bytes, ...], str]:
    """header_pass's arguments for the compile of ``source`` with ``options`` (plan_compile's):
    the same text, program name and flags as that compile."""
    flags = tuple(options.as_bytes("nvrtc", target_type))
    return str(source), options._name, flags, trace_path  # type: ignore[attr-defined]


def header_pass_job(args: tuple[str, bytes, tuple[bytes, ...], str]) -> tuple[NvrtcCall, str]:
    """What a worker runs for the header pass of header_pass_args ``args``: the front-end-only
    NvrtcCall and the trace's directory (where the worker resets NVRTC's trace state after a
    failure, job.py)."""
    source, program_name, flags, trace_path = args
    call = NvrtcCall(source, program_name, tuple(header_pass_flags(flags, trace_path)), "none", (), None)
    return call, os.path.dirname(trace_path)


def header_pass_flags(flags: Sequence[bytes], trace_path: str) -> list[bytes]:
    """The header pass's flags: the compile's, less a trace or PCH of its own, plus front end
    only and the trace to ``trace_path``."""
    kept = [f for f in flags if f.split(b"=", 1)[0] not in _NOT_IN_HEADER_PASS]
    return [*kept, *HEADER_PASS_FLAGS, b"--fdevice-time-trace=" + os.fsencode(trace_path)]


def run_compiler(
    request: CompileRequest, trace_path: str | None, started: Callable[[], None] | None = None
) -> tuple[ObjectCode, str, float]:
    """Compile with the real compiler; return (object code, log text, seconds).

    ``trace_path``: where the header pass after a successful C++ compile writes its trace (the
    headers the compile read, header_pass), or None. ``started``: called right before the
    compile itself (runners.choice.Runner).
    """
    log = LogCollector()
    start = time.perf_counter()
    source, options, call = plan_compile(request, trace_path)
    if call is not None:
        obj = call.object_code(*call.run(log, started=started))
    else:
        from cuda.core import Program

        program = Program(source, request.code_type, options=options)
        if started is not None:
            started()
        try:
            obj = program.compile(request.target_type, name_expressions=request.name_expressions, logs=log)
        finally:
            program.close()
        if trace_path is not None and request.code_type == "c++":
            header_pass(*header_pass_args(source, options, request.target_type, trace_path))
    return obj, log.text(), time.perf_counter() - start
