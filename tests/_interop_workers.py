"""Worker functions for tests/test_interop.py's processes (spawned: importable at top level)."""

from __future__ import annotations


def compile_heavy_into_cuda_core_store(root: str, code: str, arch: str) -> tuple[bool, bytes]:
    """compile_program into cuda.core's own FileStreamProgramCache; (hit, artifact bytes)."""
    from cuda.core import ProgramOptions
    from cuda.core.utils import FileStreamProgramCache

    from kernelcache import CompileInfo, compile_program

    info = CompileInfo()
    obj = compile_program(
        code,
        options=ProgramOptions(arch=arch, use_bundled_headers=True, std="c++17"),
        cache=FileStreamProgramCache(root),
        info=info,
    )
    return info.hit, bytes(obj.code)
