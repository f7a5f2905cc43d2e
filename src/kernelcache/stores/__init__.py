"""Byte stores: every one implements ProgramCacheResource (bytes in, the same bytes out).

Only the registration with cuda.core's ABC runs on import; each store class is imported on
first use (a hit from one store loads no other store's modules; Redis and the object store
need optional clients besides).
"""

from kernelcache.stores import cuda_core  # noqa: F401 - registers our stores with cuda.core's ABC

_EXPORTS = {
    "FileStreamProgramCache": "kernelcache.stores.file.store",
    "InMemoryProgramCache": "kernelcache.stores.memory",
    "KernelCacheWarning": "kernelcache.log",
    "ObjectStoreProgramCache": "kernelcache.stores.object.store",
    "ProgramCacheResource": "kernelcache.stores.base",
    "RedisProgramCache": "kernelcache.stores.redis.store",
    "TieredProgramCache": "kernelcache.stores.tiered",
    "UnsafeCacheDirError": "kernelcache.stores.file.treesafety",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelcache.stores' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
