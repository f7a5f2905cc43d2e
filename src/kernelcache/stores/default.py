"""The store compile_program uses when given none: built from the environment (kernelcache.config).

One instance per configuration: the raw variables are read on every call (a few
microseconds), parsed and checked once per distinct configuration, when its store is made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from kernelcache import config, forksafe
from kernelcache.config import urls  # the settings may name URLs: checked when the default cache is made
from kernelcache.log import WarnOnce
from kernelcache.stores.base import CountingStore, ProgramCacheResource
from kernelcache.stores.file import dircap
from kernelcache.stores.file.store import FileStreamProgramCache

if TYPE_CHECKING:
    from kernelcache.stores.tiered import Deferred

_default_lock = threading.Lock()
_default_caches: dict[tuple[object, ...], ProgramCacheResource] = {}
# The memory tier in front of disk when the default cache is tiered (a shared tier is set).
_DEFAULT_MEMORY_TIER_BYTES = 256 * 2**20
_unusable = WarnOnce()  # default roots already warned about (_warn_unusable)


def _fresh_lock_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()


forksafe.reset_function_in_child(_fresh_lock_in_child)


def default_cache() -> ProgramCacheResource:
    """The process-wide cache that ``compile_program`` uses when given none.

    A FileStreamProgramCache at ``KERNELCACHE_DIR`` (or the platformdirs user cache dir),
    capped at ``KERNELCACHE_MAX_SIZE`` (default 10 GB). With bundles (``KERNELCACHE_BUNDLES``,
    read-only; ``KERNELCACHE_BUNDLE_SECRET`` verifies signed ones) or a shared tier configured
    (``KERNELCACHE_REDIS_URL``, ``KERNELCACHE_OBJECT_STORE_URL``) it is a TieredProgramCache
    in the one order of ``default_tiers``: memory -> bundles -> disk -> Redis -> object store
    (each shared tier's ``*_SECRET`` signs entries, ``*_READ_ONLY=1`` never writes); if the
    directory cannot be used (OSError) the disk tier is skipped, with one KernelCacheWarning
    naming it. Without another tier such a directory raises the OSError
    (default_cache_or_none turns it into None). One instance per configuration; a bad
    variable raises config.ConfigError before anything is created.
    """
    # Per call: the raw values only (a few microseconds); they are parsed and checked once
    # per distinct configuration, when its cache is made.
    raw = config.default_cache_raw()
    cache = _default_caches.get(raw)
    if cache is not None:
        return cache
    config.check()
    settings = Settings.from_config()
    with _default_lock:
        cache = _default_caches.get(raw)
        if cache is None:
            cache = _default_caches[raw] = _make_default_cache(settings)
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
    message = (
        f"the default cache directory {root} cannot be used ({exc}); {fallback} "
        "(set KERNELCACHE_DIR to a writable directory, or pass cache=)"
    )
    # stacklevel: _warn_unusable <- default_cache_or_none or _make_default_cache <- ... <-
    # compile_program's caller; close enough to point at the user's code.
    _unusable.warn(root, message, stacklevel=5)


def configured_cache(root: str | None, redis_url: str | None = None) -> ProgramCacheResource:
    """A new cache configured as the default one (cap, team mode, shared tiers and secrets),
    at ``root`` instead of KERNELCACHE_DIR and with ``redis_url`` if given: for tools that
    write (``kernelcache warm``), so that warming fills the fleet's shared tiers too."""
    config.check()
    settings = Settings.from_config()
    if root is not None:
        settings = settings._replace(root=root, max_size=dircap.cap_for(root)[0])
    settings = settings._replace(redis_url=redis_url or settings.redis_url)
    return _make_default_cache(settings, skip_unusable_disk=False)  # a directory the user named must work


class Settings(NamedTuple):
    """What shapes the default cache, parsed and checked (kernelcache.config reads every value).
    (A NamedTuple: a frozen dataclass of these fields cost every first use of the default
    cache 0.6 ms of import.)"""

    root: str
    max_size: int | None
    allow_shared: bool
    redis_url: str | None = None
    redis_secret: str | None = None
    redis_read_only: bool = False
    object_store_url: str | None = None
    object_store_secret: str | None = None
    object_store_read_only: bool = False
    bundles: tuple[str, ...] = ()
    bundle_secret: str | None = None

    @classmethod
    def from_config(cls) -> Settings:
        root = config.cache_dir()
        return cls(
            root=root,
            max_size=dircap.cap_for(root)[0],
            allow_shared=config.allow_shared(),
            redis_url=config.redis_url(),
            redis_secret=config.redis_secret(),
            redis_read_only=config.redis_read_only(),
            object_store_url=config.object_store_url(),
            object_store_secret=config.object_store_secret(),
            object_store_read_only=config.object_store_read_only(),
            bundles=config.bundles(),
            bundle_secret=config.bundle_secret(),
        )


def default_tiers(settings: Settings, skip_unusable_disk: bool = True) -> list[ProgramCacheResource | Deferred]:
    """The default cache's tiers, in the one order every integration gets:
    memory -> bundles -> disk -> Redis -> object store; the disk alone when nothing else is set.

    A broken local disk (read-only HOME, another user's directory, a full disk) must not cut
    a host off from its bundles or shared tiers: with ``skip_unusable_disk`` only that tier
    is skipped (one warning); the store is kept for the process's life, so it is not retried.
    A bundle that cannot be opened (damaged, refused) is left out, with one warning.
    """
    shared = _shared_tiers(settings)
    if not shared and not settings.bundles:
        return [FileStreamProgramCache(settings.root, settings.max_size, allow_shared=settings.allow_shared)]
    from kernelcache.stores.memory import InMemoryProgramCache
    from kernelcache.stores.tiered import Deferred

    # The memory tier is this process's own: a member's cap (KERNELCACHE_MAX_SIZE) limits it
    # even where the disk tier is a team cache, which only its directory's cap governs.
    own = config.max_size_bytes() if (config.env_get("KERNELCACHE_MAX_SIZE") or "").strip() else settings.max_size
    cap = min(own or _DEFAULT_MEMORY_TIER_BYTES, _DEFAULT_MEMORY_TIER_BYTES)
    bundles = _bundle_tiers(settings.bundles, settings.bundle_secret, settings)
    memory = InMemoryProgramCache(cap)
    tiers: list[ProgramCacheResource | Deferred] = [memory, *bundles]
    try:
        disk = FileStreamProgramCache(settings.root, settings.max_size, allow_shared=settings.allow_shared)
    except OSError as exc:
        if not skip_unusable_disk or not (bundles or shared):
            raise
        names = [
            *(["Bundle"] if bundles else []),
            *(t.name if isinstance(t, Deferred) else type(t).__name__.replace("ProgramCache", "") for t in shared),
        ]
        _warn_unusable(settings.root, exc, f"using memory -> {' -> '.join(names)} only")
        return tiers + shared  # nowhere to keep the other tiers' counts: they stay in memory
    # Every tier's counts in one place, the disk tier's directory (kernelcache stats reads them).
    for tier in (memory, *bundles, *shared):
        if isinstance(tier, CountingStore):
            tier.count_into(disk.tier_counters(tier_name(tier)))
        elif isinstance(tier, Deferred):  # counted there from when it is made
            tier.make = _counted_into(tier.make, disk)
    return [*tiers, disk, *shared]


def _counted_into(
    make: Callable[[], ProgramCacheResource], disk: FileStreamProgramCache
) -> Callable[[], ProgramCacheResource]:
    def made() -> ProgramCacheResource:
        tier = make()
        if isinstance(tier, CountingStore):
            tier.count_into(disk.tier_counters(tier_name(tier)))
        return tier

    return made


def tier_name(tier: ProgramCacheResource) -> str:
    """The name a tier of the default cache is counted and shown under (stats, Prometheus)."""
    return _TIER_NAMES.get(type(tier).__name__, type(tier).__name__)


_TIER_NAMES = {
    "InMemoryProgramCache": "memory",
    "BundleProgramCache": "bundle",
    "FileStreamProgramCache": "disk",
    "RedisProgramCache": "redis",
    "ObjectStoreProgramCache": "object",
}


def _bundle_tiers(paths: tuple[str, ...], secret: str | None, settings: Settings) -> list[ProgramCacheResource]:
    if not paths:
        return []  # no bundle module imported where none is configured
    from kernelcache.stores.bundle.store import BundleProgramCache, as_secret

    tiers: list[ProgramCacheResource] = []
    for path in paths:
        try:
            if path.startswith(urls.OCI_SCHEME):  # pulled once into the cache dir, checked
                from kernelcache.stores.bundle.pulled import pulled_bundle

                local = pulled_bundle(path, settings.root, secret=as_secret(secret), team=settings.allow_shared)
                tiers.append(BundleProgramCache(local, secret=secret))
                continue
            tiers.append(BundleProgramCache(path, secret=secret))
        except (OSError, ValueError) as exc:
            # A missing, damaged or refused bundle never fails a compile: that tier is left out.
            why = (
                "there is no such file (build it with `kernelcache bundle create`, fix the path or unset the variable)"
                if isinstance(exc, FileNotFoundError)
                else str(exc)
            )
            message = f"the bundle {path} (KERNELCACHE_BUNDLES) is not used: {why}"
            _unusable.warn(f"bundle:{path}", message, stacklevel=5)
    return tiers


def _shared_tiers(settings: Settings) -> list[ProgramCacheResource | Deferred]:
    shared: list[ProgramCacheResource | Deferred] = []
    if settings.redis_url is not None:
        from kernelcache.stores.tiered import Deferred

        # Now: a missing client is the user's to fix, not a first miss's surprise. Asked of
        # config.urls, not of the Redis tier's modules: a hit from memory or disk loads none of them.
        try:
            urls.require_redis_client()
        except ImportError as exc:
            raise config.ConfigError(f"KERNELCACHE_REDIS_URL is set but {exc}") from None
        # The URL and the secret are checked (config); the store is made when a look-up first
        # reaches it: a hit from memory or disk imports none of Redis's modules, redis-py's either.
        shared.append(Deferred(partial(_redis_tier, settings), read_only=settings.redis_read_only, name="Redis"))
    if settings.object_store_url is not None:
        from kernelcache.stores.object.store import ObjectStoreProgramCache

        try:
            store = ObjectStoreProgramCache(
                settings.object_store_url,
                secret=settings.object_store_secret,
                read_only=settings.object_store_read_only,
            )
        except ImportError as exc:
            raise config.ConfigError(f"KERNELCACHE_OBJECT_STORE_URL is set but {exc}") from None
        shared.append(store)
    return shared


def _redis_tier(settings: Settings) -> ProgramCacheResource:
    from kernelcache.stores.redis.store import RedisProgramCache

    assert settings.redis_url is not None
    return RedisProgramCache(settings.redis_url, secret=settings.redis_secret, read_only=settings.redis_read_only)


def _make_default_cache(settings: Settings, skip_unusable_disk: bool = True) -> ProgramCacheResource:
    tiers = default_tiers(settings, skip_unusable_disk)
    if len(tiers) == 1:
        return tiers[0]
    from kernelcache.stores.tiered import TieredProgramCache

    return TieredProgramCache(tiers)
