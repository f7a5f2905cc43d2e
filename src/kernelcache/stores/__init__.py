"""Byte stores: every one implements ProgramCacheResource (bytes in, the same bytes out)."""

from kernelcache.log import KernelCacheWarning
from kernelcache.stores import cuda_core  # noqa: F401 - registers our stores with cuda.core's ABC
from kernelcache.stores.base import ProgramCacheResource
from kernelcache.stores.file.store import FileStreamProgramCache
from kernelcache.stores.file.treesafety import UnsafeCacheDirError
from kernelcache.stores.memory import InMemoryProgramCache
from kernelcache.stores.tiered import TieredProgramCache


def __getattr__(name: str) -> object:
    # RedisProgramCache and ObjectStoreProgramCache need optional clients: imported on first use only.
    if name == "RedisProgramCache":
        from kernelcache.stores.redis.store import RedisProgramCache

        return RedisProgramCache
    if name == "ObjectStoreProgramCache":
        from kernelcache.stores.object.store import ObjectStoreProgramCache

        return ObjectStoreProgramCache
    raise AttributeError(name)


__all__ = [
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "KernelCacheWarning",
    "ObjectStoreProgramCache",
    "ProgramCacheResource",
    "RedisProgramCache",
    "TieredProgramCache",
    "UnsafeCacheDirError",
]
