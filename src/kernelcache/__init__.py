"""kernelcache: compile CUDA kernels once, reuse them everywhere.

Public names mirror ``cuda.core.utils`` (ProgramCacheResource, InMemoryProgramCache,
FileStreamProgramCache, make_program_cache_key), so switching is one import.
Importing this package does not import cuda.core or load any compiler.
"""

from kernelcache.compile import CompileInfo, compile_program, default_cache
from kernelcache.guarded import CacheClearedDuringBuild, DeviceDestroyedDuringBuild, GuardedCache
from kernelcache.kernels import KernelCache
from kernelcache.keys import explain_program_cache_key, make_program_cache_key
from kernelcache.stores import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    ProgramCacheResource,
    TieredProgramCache,
    UnsafeCacheDirError,
)


def __getattr__(name: str) -> object:
    # RedisProgramCache needs the optional redis client: kernelcache.stores loads it on first use.
    from kernelcache import stores

    return getattr(stores, name)


__version__ = "0.1.0"

__all__ = [
    "CacheClearedDuringBuild",
    "DeviceDestroyedDuringBuild",
    "GuardedCache",
    "KernelCache",
    "CompileInfo",
    "compile_program",
    "default_cache",
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "KernelCacheWarning",
    "ProgramCacheResource",
    "RedisProgramCache",
    "TieredProgramCache",
    "UnsafeCacheDirError",
    "explain_program_cache_key",
    "make_program_cache_key",
]
