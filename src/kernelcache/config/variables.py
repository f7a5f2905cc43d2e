"""Every variable kernelcache reads, in one table (`kernelcache config` lists it)."""

from __future__ import annotations

from kernelcache.log import WarnOnce

# Every variable kernelcache reads: (name, what `kernelcache config` calls it, its default).
# A KERNELCACHE_* variable not listed here is a warning naming the closest listed one.
VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("KERNELCACHE_DIR", "cache dir", "the user cache dir"),
    ("KERNELCACHE_MAX_SIZE", "max size", "10.0 GB"),
    ("KERNELCACHE_ALLOW_SHARED", "team mode (allow shared)", "off"),
    ("KERNELCACHE_WAIT_TIMEOUT", "wait timeout", "600 s"),
    ("KERNELCACHE_DISABLE", "disable", "off"),
    ("KERNELCACHE_RECACHE", "recache (compile, store, replace)", "off"),
    ("KERNELCACHE_REDIS_URL", "redis url", "unset"),
    ("KERNELCACHE_REDIS_SECRET", "redis secret", "unset"),
    ("KERNELCACHE_REDIS_READ_ONLY", "redis read only", "off"),
    ("KERNELCACHE_OBJECT_STORE_URL", "object store url", "unset"),
    ("KERNELCACHE_OBJECT_STORE_SECRET", "object store secret", "unset"),
    ("KERNELCACHE_OBJECT_STORE_READ_ONLY", "object store read only", "off"),
    ("KERNELCACHE_BUNDLES", "bundles", "unset"),
    ("KERNELCACHE_BUNDLE_SECRET", "bundle secret", "unset"),
    ("KERNELCACHE_OCI_USERNAME", "OCI registry user", "unset (the docker config's)"),
    ("KERNELCACHE_OCI_PASSWORD", "OCI registry password", "unset"),
    ("KERNELCACHE_OCI_TOKEN", "OCI registry token", "unset"),
    ("KERNELCACHE_RECORD", "record", "unset"),
    ("KERNELCACHE_REQUIRE_HIT", "require hit", "off"),
    ("KERNELCACHE_BASE_DIR", "base dir", "unset"),
    ("KERNELCACHE_CONFIG", "config file", "<user config dir>/kernelcache/config.toml"),
)
# Variables of an earlier release that do nothing now: one warning where one is set (not for 0).
REMOVED = {
    "KERNELCACHE_COMPILE_SERVER": (
        "the compile server was removed (compile workers share the node's cores through its compile slots "
        "and end with their process; README: Compile workers)"
    ),
    "KERNELCACHE_COMPILE_SERVER_IDLE": "the compile server was removed (README: Compile workers)",
}
# Read by kernelcache's own test suite only (tests/): not a setting, never warned about.
_TEST_VARIABLES = ("KERNELCACHE_BIG_TESTS",)
KNOWN = tuple(name for name, _, _ in VARIABLES) + tuple(REMOVED) + _TEST_VARIABLES


def warn_removed() -> None:
    """One warning per variable of REMOVED that is set (its value is neither "0" nor empty: those
    ask for what happens now anyway)."""
    from kernelcache import config

    for name, why in REMOVED.items():
        value = config.env_get(name)
        if value is not None and value.strip() not in ("", "0"):
            text = f"{name}={config.shown(value)} is set, but {name} no longer exists: {why}; unset it"
            _removed.warn(name, text, stacklevel=3)


_removed = WarnOnce()
