"""Byte stores: every one implements ProgramCacheResource (bytes in, the same bytes out)."""

from kernelcache.stores.base import KernelCacheWarning, ProgramCacheResource
from kernelcache.stores.filestream import FileStreamProgramCache, UnsafeCacheDirError
from kernelcache.stores.memory import InMemoryProgramCache

__all__ = [
    "FileStreamProgramCache",
    "InMemoryProgramCache",
    "KernelCacheWarning",
    "ProgramCacheResource",
    "UnsafeCacheDirError",
]
