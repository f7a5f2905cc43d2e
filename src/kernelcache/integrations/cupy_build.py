"""What CuPy 14 does to a RawModule's source and options before NVRTC, done the same way here.

Read from CuPy's own ``compile_with_cache`` and ``_compile_with_cache_cuda``: the command line
(CuPy's include paths and default standard first, the user's flags in order, ``-ftz=true``,
the debug flags under ``CUPY_CUDA_COMPILE_WITH_DEBUG``, the device's arch and
``--device-as-default-execution-space``), the source translation of ``translate_cucomplex``,
the link against cudadevrt for relocatable code, and the CompileException a failed compile
raises. ``handoff_reason`` names what only CuPy's own classes can do (nvcc, Jitify, PCH).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

import cupy
from cupy.cuda import compiler

# CuPy's translate_cucomplex: an "#include <cuComplex.h>" line becomes its Thrust bridge.
_CUCOMPLEX_INCLUDE = re.compile(r"\s*".join(["", "#", "include", "<", r"cuComplex\.h", ">"]))
_CUCOMPLEX_BRIDGE = "#include <cupy/cuComplex_bridge.h>  // translate_cucomplex\n"
_LINKED_DOMAIN = b"kernelcache.cupy.linked/1\x00"


def _core() -> Any:
    from cupy._core import core

    return core


def _cupy_header() -> str | None:
    """The includes CuPy prepends to a translated source (its ``_cupy_header``), or None
    where this CuPy does not expose the list it is made of."""
    names = getattr(_core(), "_cupy_header_list", None)
    if not isinstance(names, list):
        return None
    # CuPy builds the header once at import, before translate_cucomplex appends its bridge
    # to the same list: the bridge is never part of it.
    return "".join(f"#include <{n}>\n" for n in names if n != "cupy/cuComplex_bridge.h")


def handoff_reason(backend: str, options: Sequence[str], translate_cucomplex: bool, jitify: Any) -> str | None:
    """Why this RawModule/RawKernel must be CuPy's own object (None: kernelcache compiles it)."""
    if backend != "nvrtc":
        return f"backend={backend!r} (kernelcache compiles with NVRTC)"
    if jitify or "-DCUPY_USE_JITIFY" in tuple(options):
        return "jitify=True"
    if getattr(compiler, "_use_pch", False):
        return "CUPY_NVRTC_USE_PCH=1 (NVRTC writes precompiled headers of its own)"
    if translate_cucomplex and _cupy_header() is None:
        return f"translate_cucomplex=True with CuPy {cupy.__version__} (its header list is not readable)"
    return None


def source_for_nvrtc(code: str, translate_cucomplex: bool) -> str:
    """The source NVRTC compiles: CuPy's cuComplex translation and header prelude when asked."""
    if not translate_cucomplex:
        return code
    lines = [_CUCOMPLEX_BRIDGE if _CUCOMPLEX_INCLUDE.match(line) else line for line in code.splitlines(keepends=True)]
    return (_cupy_header() or "") + "".join(lines)


def command_line(options: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """CuPy's NVRTC command line for ``options`` on the current device, in CuPy's order, and
    the target (cubin, or ptx where NVRTC cannot build the device's SASS)."""
    argv = (*_core().assemble_cupy_compiler_options(tuple(options)), "-ftz=true")
    # Read per compile, as CuPy reads it, with CuPy's own parser of the variable.
    if compiler._get_bool_env_variable("CUPY_CUDA_COMPILE_WITH_DEBUG", False):
        argv += ("--device-debug", "--generate-line-info")
    arch_opt, method = compiler._get_arch_for_options_for_nvrtc(compiler._get_arch())
    return (*argv, arch_opt, "--device-as-default-execution-space"), method


def needs_cudadevrt(argv: Sequence[str]) -> bool:
    """CuPy's rule: these exact flags make it link the compile against cudadevrt."""
    return bool(compiler._is_cudadevrt_needed(tuple(argv)))


def compile_exception(exc: BaseException, source: str, argv: Sequence[str]) -> Exception:
    """CuPy's CompileException for a failed NVRTC compile: its message is NVRTC's log."""
    text = str(exc)
    _, found, log = text.partition("compilation log:\n\n")
    return compiler.CompileException(
        (log if found else text).rstrip("\x00"), source, "default_program", tuple(argv), "nvrtc"
    )


def link_cudadevrt(store: Any, compiled_key: bytes, relocatable: bytes, kernels: list[str]) -> bytes:
    """The relocatable cubin linked with cudadevrt by CuPy's own LinkState (the driver's
    linker, as CuPy links), stored once as one linked cubin when ``store`` is given.

    Keyed by the relocatable entry's key, the cudadevrt library's content and the driver
    version: what decides the linker's output.
    """
    from cupy.cuda import function

    cudadevrt = compiler._get_cudadevrt_path()
    key = b""
    if store is not None and compiled_key:
        with open(cudadevrt, "rb") as f:
            library = hashlib.sha256(f.read()).digest()
        driver = str(cupy.cuda.runtime.driverGetVersion()).encode()
        key = _LINKED_DOMAIN + hashlib.sha256(compiled_key + library + driver).digest()
        record = store.get_record(key)
        if record is not None:
            return bytes(record[0])
    link = function.LinkState()
    link.add_ptr_data(relocatable, "cupy.ptx")
    link.add_ptr_file(cudadevrt)
    linked = bytes(link.complete())
    if key:
        meta = {"kind": "cupy-linked", "code_type": "cupy", "target_type": "cubin", "kernels": kernels}
        store.set_record(key, linked, meta)
    return linked
