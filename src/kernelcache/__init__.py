"""kernelcache: compile CUDA kernels once, reuse them everywhere.

Public names mirror ``cuda.core.utils`` (ProgramCacheResource, InMemoryProgramCache,
FileStreamProgramCache, make_program_cache_key), so switching is one import.
Importing this package loads nothing but this file: each name is imported on first use
(PEP 562), so a process that only reads the cache never loads the compile machinery, and
none of it loads a compiler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

try:  # file locks (flock, lockf) are what keep processes from clobbering each other's entries
    import fcntl  # noqa: F401
except ImportError:
    raise ImportError(
        "kernelcache runs on Linux and macOS, not on this platform: it needs fcntl (POSIX file locks), "
        "which Windows does not have"
    ) from None

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "BundleProgramCache": "kernelcache.stores.bundle.store",
    "CacheClearedDuringBuild": "kernelcache.kernels.guarded",
    "CacheMissError": "kernelcache.compile.strict",
    "CompileInfo": "kernelcache.compile.flow",
    "CompileManyError": "kernelcache.compile.batch",
    "DeviceDestroyedDuringBuild": "kernelcache.kernels.guarded",
    "FileStreamProgramCache": "kernelcache.stores.file.store",
    "GuardedCache": "kernelcache.kernels.guarded",
    "InMemoryProgramCache": "kernelcache.stores.memory",
    "KernelCache": "kernelcache.kernels.cache",
    "KernelCacheWarning": "kernelcache.log",
    "ObjectStoreProgramCache": "kernelcache.stores.object.store",  # needs the optional obstore client
    "ProgramCacheResource": "kernelcache.stores.base",
    "RedisProgramCache": "kernelcache.stores.redis.store",  # needs the optional redis client
    "TieredProgramCache": "kernelcache.stores.tiered",
    "UnsafeCacheDirError": "kernelcache.stores.file.treesafety",
    "compile_many": "kernelcache.compile.batch",
    "compile_program": "kernelcache.compile.flow",
    "default_cache": "kernelcache.stores.default",
    "explain_program_cache_key": "kernelcache.keys.derive",
    "make_program_cache_key": "kernelcache.keys.derive",
    "probe": "kernelcache.compile.flow",
    "warm": "kernelcache.cli.warm",
}

__all__ = [
    "BundleProgramCache",
    "CacheClearedDuringBuild",
    "CacheMissError",
    "CompileInfo",
    "CompileManyError",
    "DeviceDestroyedDuringBuild",
    "FileStreamProgramCache",
    "GuardedCache",
    "InMemoryProgramCache",
    "KernelCache",
    "KernelCacheWarning",
    "ObjectStoreProgramCache",
    "ProgramCacheResource",
    "RedisProgramCache",
    "TieredProgramCache",
    "UnsafeCacheDirError",
    "compile_many",
    "compile_program",
    "default_cache",
    "explain_program_cache_key",
    "make_program_cache_key",
    "probe",
    "warm",
]  # the same names as _EXPORTS (tests/test_package.py checks)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelcache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:  # for type checkers and IDEs: the names as if imported eagerly
    from kernelcache.compile.batch import CompileManyError, compile_many
    from kernelcache.compile.flow import CompileInfo, compile_program, probe
    from kernelcache.compile.strict import CacheMissError
    from kernelcache.kernels.cache import KernelCache
    from kernelcache.kernels.guarded import CacheClearedDuringBuild, DeviceDestroyedDuringBuild, GuardedCache
    from kernelcache.keys.derive import explain_program_cache_key, make_program_cache_key
    from kernelcache.log import KernelCacheWarning
    from kernelcache.stores.base import ProgramCacheResource
    from kernelcache.stores.bundle.store import BundleProgramCache
    from kernelcache.stores.default import default_cache
    from kernelcache.stores.file.store import FileStreamProgramCache
    from kernelcache.stores.file.treesafety import UnsafeCacheDirError
    from kernelcache.stores.memory import InMemoryProgramCache
    from kernelcache.stores.object.store import ObjectStoreProgramCache
    from kernelcache.stores.redis.store import RedisProgramCache
    from kernelcache.stores.tiered import TieredProgramCache
