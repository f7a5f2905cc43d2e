"""The store compile_program uses when given none: built from the environment (config.py).

One instance per configuration: the raw variables are read on every call (a few
microseconds), parsed and checked once per distinct configuration, when its store is made.
"""

from __future__ import annotations

import threading
import warnings

from kernelcache import config
from kernelcache.log import logger
from kernelcache.stores.base import KernelCacheWarning, ProgramCacheResource
from kernelcache.stores.file.store import FileStreamProgramCache

_default_lock = threading.Lock()
_default_caches: dict[tuple[object, ...], ProgramCacheResource] = {}
# The memory tier in front of disk when the default cache is tiered (KERNELCACHE_REDIS_URL).
_DEFAULT_MEMORY_TIER_BYTES = 256 * 2**20
_unusable_roots: set[str] = set()  # default roots already warned about (_warn_unusable)
# Its own lock: _warn_unusable also runs inside _make_default_cache, under _default_lock.
_unusable_lock = threading.Lock()


def default_cache() -> ProgramCacheResource:
    """The process-wide cache that ``compile_program`` uses when given none.

    A FileStreamProgramCache at ``KERNELCACHE_DIR`` (or the platformdirs user cache dir),
    capped at ``KERNELCACHE_MAX_SIZE`` (default 10 GB). With ``KERNELCACHE_REDIS_URL`` set it
    is a TieredProgramCache: memory -> that disk cache -> Redis (``KERNELCACHE_REDIS_SECRET``
    signs entries, ``KERNELCACHE_REDIS_READ_ONLY=1`` never writes); if the directory cannot
    be used (OSError) it is memory -> Redis, with one KernelCacheWarning naming it. Without
    Redis such a directory raises the OSError (default_cache_or_none turns it into None).
    One instance per configuration; a bad variable raises config.ConfigError before
    anything is created.
    """
    # Per call: the raw values only (a few microseconds); they are parsed and checked once
    # per distinct configuration, when its cache is made.
    raw = config.default_cache_raw()
    cache = _default_caches.get(raw)
    if cache is not None:
        return cache
    config.check()
    settings = (
        config.cache_dir(),
        config.max_size_bytes(),
        config.allow_shared(),
        config.redis_url(),
        config.redis_secret(),
        config.redis_read_only(),
    )
    with _default_lock:
        cache = _default_caches.get(raw)
        if cache is None:
            cache = _default_caches[raw] = _make_default_cache(*settings)
        return cache


def default_cache_or_none() -> ProgramCacheResource | None:
    """default_cache(), or None (with one warning per directory) when it cannot be opened.

    A read-only HOME, a full disk or a directory that another user owns must not make a
    compile fail that would succeed without a cache: such a process compiles uncached.
    A bad environment value (config.ConfigError) still raises: that is for the user to fix.
    """
    try:
        return default_cache()
    except OSError as exc:
        _warn_unusable(config.cache_dir(), exc, "compiling uncached")
        return None


def _warn_unusable(root: str, exc: OSError, fallback: str) -> None:
    """One warning (and log line) per default root that cannot be used, saying what we do instead."""
    with _unusable_lock:
        first = root not in _unusable_roots
        _unusable_roots.add(root)
    if first:
        message = (
            f"the default cache directory {root} cannot be used ({exc}); {fallback} "
            "(set KERNELCACHE_DIR to a writable directory, or pass cache=)"
        )
        logger.warning("%s", message)
        # stacklevel: warnings.warn <- here <- default_cache_or_none or _make_default_cache
        # <- ... <- compile_program's caller; close enough to point at the user's code.
        warnings.warn(f"kernelcache: {message}", KernelCacheWarning, stacklevel=5)


def configured_cache(root: str | None, redis_url: str | None = None) -> ProgramCacheResource:
    """A new cache configured as the default one (cap, team mode, Redis tier and its secret),
    at ``root`` instead of KERNELCACHE_DIR and with ``redis_url`` if given: for tools that
    write (``kernelcache warm``), so that warming fills the fleet's Redis too."""
    config.check()
    return _make_default_cache(
        root if root is not None else config.cache_dir(),
        config.max_size_bytes(),
        config.allow_shared(),
        redis_url or config.redis_url(),
        config.redis_secret(),
        config.redis_read_only(),
        skip_unusable_disk=False,  # warm --cache-dir: a directory the user named must work
    )


def _make_default_cache(
    root: str,
    max_size: int | None,
    allow_shared: bool,
    url: str | None,
    secret: str | None,
    read_only: bool,
    skip_unusable_disk: bool = True,
) -> ProgramCacheResource:
    if url is None:
        return FileStreamProgramCache(root, max_size, allow_shared=allow_shared)
    try:
        from kernelcache.stores.redis.store import RedisProgramCache
    except ImportError as exc:
        raise config.ConfigError(
            f"KERNELCACHE_REDIS_URL is set but the redis client is missing ({exc}): pip install 'kernelcache[redis]'"
        ) from None
    from kernelcache.stores.memory import InMemoryProgramCache
    from kernelcache.stores.tiered import TieredProgramCache

    tiers: list[ProgramCacheResource] = []
    memory_cap = _DEFAULT_MEMORY_TIER_BYTES if max_size is None else min(max_size, _DEFAULT_MEMORY_TIER_BYTES)
    tiers.append(InMemoryProgramCache(memory_cap))
    try:
        tiers.append(FileStreamProgramCache(root, max_size, allow_shared=allow_shared))
    except OSError as exc:
        # A broken local disk (read-only HOME, another user's directory, a full disk) must
        # not cut a fleet host off from Redis: skip only that tier. This store is kept for
        # the process's life (one per configuration), so the disk is not retried later.
        if not skip_unusable_disk:
            raise
        _warn_unusable(root, exc, "using memory -> Redis only")
    tiers.append(RedisProgramCache(url, secret=secret, read_only=read_only))
    return TieredProgramCache(tiers)
