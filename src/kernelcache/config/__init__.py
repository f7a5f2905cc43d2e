"""Every environment variable kernelcache reads, parsed and validated in one place.

Each is read per call, not at import, so a process (or a test) may change it at any time.
A bad value raises :class:`ConfigError` (a ValueError) at once, naming the variable, the
value, and what it accepts; :func:`check` names every bad variable in one error.

| variable                      | default                         | effect                                   |
| KERNELCACHE_DIR               | platformdirs user cache dir     | root of the default file cache           |
| KERNELCACHE_DISABLE           | off                             | compile without any cache                |
| KERNELCACHE_RECACHE           | off                             | compile, store and replace (one run)     |
| KERNELCACHE_WAIT_TIMEOUT      | 600                             | seconds to wait for a peer's compile     |
| KERNELCACHE_MAX_SIZE          | 10GB                            | cap of the default cache (none: no cap)  |
| KERNELCACHE_ALLOW_SHARED      | off                             | accept a group-shared (team) cache dir   |
| KERNELCACHE_REDIS_URL         | unset                           | default cache = memory -> disk -> Redis  |
| KERNELCACHE_REDIS_SECRET      | unset                           | sign and verify Redis entries            |
| KERNELCACHE_REDIS_READ_ONLY   | off                             | never write to Redis                     |
| KERNELCACHE_OBJECT_STORE_URL  | unset                           | add an object-store tier after Redis     |
| KERNELCACHE_OBJECT_STORE_SECRET | unset                         | sign and verify object-store records     |
| KERNELCACHE_OBJECT_STORE_READ_ONLY | off                        | never write to the object store          |
| KERNELCACHE_RECORD            | unset                           | append every request to this lockfile    |
| KERNELCACHE_REQUIRE_HIT       | off                             | a miss raises (1) or warns (warn)        |
| KERNELCACHE_BUNDLES           | unset                           | read-only bundles after the memory tier  |
| KERNELCACHE_BUNDLE_SECRET     | unset                           | the secret those bundles are signed with |
| KERNELCACHE_OCI_USERNAME / _PASSWORD / _TOKEN | unset           | credentials for OCI registries           |
| KERNELCACHE_BASE_DIR          | unset                           | paths under it enter keys relative to it |
"""

from __future__ import annotations

import importlib
import math
import os
from typing import Any

from kernelcache.config import file as configfile
from kernelcache.config.sizes import format_size as format_size  # re-exported: config.format_size
from kernelcache.config.sizes import parse_size, shown
from kernelcache.config.variables import KNOWN, VARIABLES, warn_removed  # noqa: F401 - VARIABLES: config.VARIABLES

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

# sccache's default; ccache's is 5 GB. A finite default keeps an unattended cache from
# filling a disk (an unbounded default is why JAX could not turn its cache on by default).
DEFAULT_MAX_SIZE = 10 * 10**9
_NO_CAP = ("none", "unlimited", "0")
# About 31 years. A lock wait longer than threading.TIMEOUT_MAX (about 292 years here) or a
# deadline past time_t raises OverflowError in every compile: 1e10 was accepted, then failed.
MAX_WAIT_S = 1e9


class ConfigError(ValueError):
    """An environment variable holds a value kernelcache cannot use."""


def _env(name: str, default: str = "") -> str:
    """The value of ``name`` ("" when unset): the environment's, else the config file's (config.file)."""
    value = env_get(name)
    return default if value is None else value


def _flag(name: str) -> bool:
    configfile.ensure_loaded(KNOWN, ConfigError)
    data = getattr(os.environ, "_data", None)
    if _POSIX and type(data) is dict:  # as env_get, inline: every hit asks two flags
        found = data.get(_ENCODED[name])
        if found is None:  # unset (the usual case): off
            return False
        raw = os.fsdecode(found)
    else:
        raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={shown(raw)} is not a yes/no value: use 1/true/yes/on or 0/false/no/off, or unset it")


def cache_dir() -> str:
    """``KERNELCACHE_DIR`` if set (``~`` expanded), else the platform's user cache dir for "kernelcache"."""
    env = _env("KERNELCACHE_DIR")
    if env:
        # Set where no shell expands it (a systemd unit, a Dockerfile ENV), "~/kc" means the
        # home's kc, never a directory named "~" in whatever the current directory is.
        return os.path.expanduser(env)
    return configfile.user_dir("cache")


def cache_dir_is_from_env(root: str) -> bool:
    """Whether ``root`` is the directory ``KERNELCACHE_DIR`` names (so errors can name the variable)."""
    env = _env("KERNELCACHE_DIR")
    return bool(env) and os.path.abspath(os.path.expanduser(env)) == os.path.abspath(root)


def disabled() -> bool:
    """``KERNELCACHE_DISABLE`` is 1/true/yes/on: compile_program compiles without any cache."""
    return _flag("KERNELCACHE_DISABLE")


def is_wait_s(value: float) -> bool:
    """Whether a lock wait can take ``value`` seconds: 0 to MAX_WAIT_S, or inf (forever); never NaN."""
    return 0 <= value <= MAX_WAIT_S or value == math.inf


def wait_timeout_s() -> float:
    """``KERNELCACHE_WAIT_TIMEOUT`` (seconds a caller waits for a peer's compile) if set, else 600.

    ``inf`` waits forever; NaN, negative values and finite values above MAX_WAIT_S are errors.
    """
    raw = _env("KERNELCACHE_WAIT_TIMEOUT", "")
    try:
        value = float(raw) if raw.strip() else 600.0
    except ValueError:
        value = -1.0
    if not is_wait_s(value):
        raise ConfigError(
            f"KERNELCACHE_WAIT_TIMEOUT={shown(raw)}: use a number of seconds from 0 to {MAX_WAIT_S:g} "
            "(e.g. 600), or inf to wait forever"
        )
    return value


def parse_cap(text: str) -> int | None:
    """A cap as every cap setting takes it: a size, or ``none``/``unlimited``/``0`` for no cap."""
    if text.strip().lower() in _NO_CAP:
        return None
    size = parse_size(text)
    if size == 0:  # "0GB", "0.5B": not the no-cap spelling "0"
        raise ValueError(f"{shown(text)} is less than one byte: use e.g. 500MB, or 'none' for no cap")
    return size


def max_size_bytes() -> int | None:
    """``KERNELCACHE_MAX_SIZE`` (e.g. ``10GB``; ``none`` for no cap), else 10 GB: the default cache's cap."""
    raw = _env("KERNELCACHE_MAX_SIZE", "")
    if not raw.strip():
        return DEFAULT_MAX_SIZE
    try:
        return parse_cap(raw)
    except ValueError as exc:
        raise ConfigError(f"KERNELCACHE_MAX_SIZE: {exc} (or 'none' for no cap)") from None


def recache() -> bool:
    """``KERNELCACHE_RECACHE`` is 1/true/yes/on: compile even what is stored, store it, replace the old entry."""
    return _flag("KERNELCACHE_RECACHE")


def allow_shared() -> bool:
    """``KERNELCACHE_ALLOW_SHARED`` is 1/true/yes/on: accept a group-shared (team) cache directory."""
    return _flag("KERNELCACHE_ALLOW_SHARED")


def redis_url() -> str | None:
    """``KERNELCACHE_REDIS_URL``: when set, the default cache is memory -> disk -> this Redis."""
    raw = _env("KERNELCACHE_REDIS_URL", "").strip()
    if not raw:
        return None
    from kernelcache.config import urls

    if not raw.startswith(urls.REDIS_SCHEMES):
        raise ConfigError(
            f"KERNELCACHE_REDIS_URL={shown(raw)} is not a Redis URL: use redis://host:port/db, "
            "rediss:// (TLS), unix:///path.sock or redis+cluster://host:port"
        )
    try:
        urls.check_redis_url(raw)
    except ImportError:
        pass  # no redis client: default_cache says so when it needs one
    except ValueError as exc:
        raise ConfigError(f"KERNELCACHE_REDIS_URL={shown(raw)}: {exc}") from None
    return raw


def redis_secret() -> str | None:
    """``KERNELCACHE_REDIS_SECRET``: sign Redis entries, and trust only entries signed with it."""
    return _env("KERNELCACHE_REDIS_SECRET") or None


def redis_read_only() -> bool:
    """``KERNELCACHE_REDIS_READ_ONLY`` is 1/true/yes/on: read the Redis tier, never write it."""
    return _flag("KERNELCACHE_REDIS_READ_ONLY")


def object_store_url() -> str | None:
    """``KERNELCACHE_OBJECT_STORE_URL`` (``s3://bucket/path``, ``gs://...``, ``az://...``): a tier after Redis."""
    raw = _env("KERNELCACHE_OBJECT_STORE_URL", "").strip()
    if not raw:
        return None
    from kernelcache.config import urls

    try:
        return urls.check_object_store_url(raw)
    except ValueError as exc:
        raise ConfigError(f"KERNELCACHE_OBJECT_STORE_URL={shown(raw)}: {exc}") from None


def object_store_secret() -> str | None:
    """``KERNELCACHE_OBJECT_STORE_SECRET``: sign object-store records, and trust only records signed with it."""
    return _env("KERNELCACHE_OBJECT_STORE_SECRET") or None


def object_store_read_only() -> bool:
    """``KERNELCACHE_OBJECT_STORE_READ_ONLY`` is 1/true/yes/on: read the object-store tier, never write it."""
    return _flag("KERNELCACHE_OBJECT_STORE_READ_ONLY")


def record_path() -> str | None:
    """``KERNELCACHE_RECORD``: the warm manifest (JSON Lines) every compile request is appended to.

    ``~`` expanded, made absolute against the current directory. A directory, or a path whose
    parent directory does not exist, is a ConfigError (so a typo fails at once, not never).
    """
    raw = env_get("KERNELCACHE_RECORD")
    if not raw:
        return None
    checked = _record_checked.get(raw)
    if checked is not None:
        return checked
    try:
        path = os.path.abspath(os.path.expanduser(raw))
    except FileNotFoundError:
        # A relative path in a working directory that was deleted (batch schedulers do):
        # not a bad value; appending to it fails with one warning and the compile goes on.
        return raw
    if os.path.isdir(path):
        raise ConfigError(f"KERNELCACHE_RECORD={shown(raw)} is a directory: name a file, e.g. kernels.lock.json")
    if not os.path.isdir(os.path.dirname(path)):
        raise ConfigError(
            f"KERNELCACHE_RECORD={shown(raw)}: the directory {os.path.dirname(path)} does not exist; create it first"
        )
    if not os.path.isabs(os.path.expanduser(raw)):
        return path  # relative: resolved per call (the current directory may change), not memoised
    _record_checked[raw] = path
    return path


_record_checked: dict[str, str] = {}  # absolute raw value -> the checked path (one stat per value)


def require_hit() -> str | None:
    """``KERNELCACHE_REQUIRE_HIT``: "raise" (1/true/yes/on), "warn", or None (unset, 0/false/no/off).

    "raise": a miss raises CacheMissError instead of compiling; "warn": it compiles, with
    one KernelCacheWarning per miss.
    """
    raw = env_get("KERNELCACHE_REQUIRE_HIT")
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return "raise"
    if value == "warn":
        return "warn"
    if value in _FALSE:
        return None
    raise ConfigError(
        f"KERNELCACHE_REQUIRE_HIT={shown(raw)}: use 1 (a miss raises CacheMissError), "
        "warn (a miss compiles and warns) or 0, or unset it"
    )


def env_get(name: str) -> str | None:
    """``os.environ.get(name)`` (None when unset; the config file loaded first), without the
    exception an unset variable costs inside: every variable is read on every call.

    See default_cache_raw: on CPython for POSIX, os.environ's own backing dict answers it.
    The config file's values are in the environment once it is loaded (config.file).
    """
    configfile.ensure_loaded(KNOWN, ConfigError)  # a compare when KERNELCACHE_CONFIG is unchanged
    data = getattr(os.environ, "_data", None)
    if _POSIX and type(data) is dict:
        value = data.get(_ENCODED.get(name) or os.fsencode(name))
        return None if value is None else os.fsdecode(value)
    return os.environ.get(name)


_POSIX = os.name == "posix"
_ENCODED = {name: os.fsencode(name) for name in KNOWN}
_CALL_FLAGS = tuple(_ENCODED[name] for name in ("KERNELCACHE_DISABLE", "KERNELCACHE_RECORD", "KERNELCACHE_RECACHE"))


def call_flags_unset() -> bool:
    """True when none of ``KERNELCACHE_DISABLE``, ``KERNELCACHE_RECORD``, ``KERNELCACHE_RECACHE``
    is set (the config file loaded first: its values are in the environment then), read now: a
    compile_program call then need not ask each (three look-ups in os.environ's own dict)."""
    configfile.ensure_loaded(KNOWN, ConfigError)
    data = getattr(os.environ, "_data", None)
    if not _POSIX or type(data) is not dict:
        return False  # not CPython's POSIX environ: each flag is asked on its own
    return not any(map(data.__contains__, _CALL_FLAGS))


def bundles() -> tuple[str, ...]:
    """``KERNELCACHE_BUNDLES`` (``a.kcb:oci://registry/repo:tag``): bundles read right after the memory
    tier (absolute paths or OCI references; whether a file is there is the default cache's to find out)."""
    raw = _env("KERNELCACHE_BUNDLES")
    if not raw.strip():
        return ()
    from kernelcache.config import oci, urls

    paths = urls.split_bundle_list(raw, os.pathsep)
    for path in paths:
        if path.startswith(urls.OCI_SCHEME):  # pulled when the default cache is made (stores/bundle/pulled.py)
            oci.check_bundle_reference(path)
            continue
        if not path.strip() or path != path.strip():
            raise ConfigError(
                f"KERNELCACHE_BUNDLES={shown(raw)} has an empty or space-padded entry: "
                f"give bundle paths separated by {os.pathsep!r}, e.g. /opt/kc/base.kcb{os.pathsep}/opt/kc/extra.kcb"
            )
        if not os.path.isabs(os.path.expanduser(path)):
            raise ConfigError(
                f"KERNELCACHE_BUNDLES: {path!r} is a relative path (it would change with the working "
                "directory): give absolute paths"
            )
        # A path that holds no bundle (not built yet, a volume not mounted) is no bad value: the
        # default cache leaves that tier out with one warning (stores/default.py), as the README says.
    return tuple(p if p.startswith(urls.OCI_SCHEME) else os.path.expanduser(p) for p in paths)


# What only a URL, a bundle list or an OCI registry needs, imported on first use (PEP 562):
# config.urls, config.oci and its credential readers (config.oci_token...). A process whose
# configuration names no URL (a hit from a store it was given) never loads them.
_LAZY = {"urls": None, "oci": None, "oci_password": "oci", "oci_token": "oci", "oci_username": "oci"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_LAZY[name] or name}")
    return module if _LAZY[name] is None else getattr(module, name)


def bundle_secret() -> str | None:
    """``KERNELCACHE_BUNDLE_SECRET``: the bundles of KERNELCACHE_BUNDLES must be signed with it."""
    return _env("KERNELCACHE_BUNDLE_SECRET") or None


def base_dir() -> str | None:
    """``KERNELCACHE_BASE_DIR`` (ccache's base_dir): paths under it enter compile_program's keys
    relative to it, so checkouts of one project at different paths share entries."""
    raw = _env("KERNELCACHE_BASE_DIR")
    if not raw.strip():
        return None
    path = os.path.expanduser(raw)
    if not os.path.isabs(path) or not os.path.normpath(path).strip(os.sep):
        raise ConfigError(
            f"KERNELCACHE_BASE_DIR={shown(raw)}: give an absolute directory other than / "
            "(the root of your checkouts, e.g. /home/alice/src), or unset it"
        )
    return os.path.normpath(path)


_DEFAULT_CACHE_VARS = (
    "KERNELCACHE_DIR",
    "KERNELCACHE_MAX_SIZE",
    "KERNELCACHE_ALLOW_SHARED",
    "KERNELCACHE_REDIS_URL",
    "KERNELCACHE_REDIS_SECRET",
    "KERNELCACHE_REDIS_READ_ONLY",
    "KERNELCACHE_OBJECT_STORE_URL",
    "KERNELCACHE_OBJECT_STORE_SECRET",
    "KERNELCACHE_OBJECT_STORE_READ_ONLY",
    "KERNELCACHE_CONFIG",
    "KERNELCACHE_BUNDLES",
    "KERNELCACHE_BUNDLE_SECRET",
)


_ENCODED_VARS = tuple(os.fsencode(name) for name in _DEFAULT_CACHE_VARS)


def default_cache_raw() -> tuple[object, ...]:
    """The raw values of the variables that shape the default cache: a cheap memo key.

    compile_program asks for the default cache on every call, so this is on the hit path.
    ``os.environ.get`` of an unset variable costs an exception inside (about 0.7 us each
    here); on CPython for POSIX the environment's backing dict (bytes -> bytes, kept in
    sync by os.environ itself) answers the same question without one.
    """
    configfile.ensure_loaded(KNOWN, ConfigError)  # a compare when KERNELCACHE_CONFIG is unchanged
    data = getattr(os.environ, "_data", None)
    if isinstance(data, dict) and os.name == "posix":
        return tuple([data.get(name) for name in _ENCODED_VARS])
    get = os.environ.get
    return tuple([get(name) for name in _DEFAULT_CACHE_VARS])


_CHECKS = (
    disabled,
    recache,
    wait_timeout_s,
    max_size_bytes,
    allow_shared,
    redis_url,
    redis_secret,
    redis_read_only,
    object_store_url,
    object_store_secret,
    object_store_read_only,
    record_path,
    require_hit,
    bundles,
    base_dir,
)


def check() -> None:
    """Validate every variable; one ConfigError naming each bad one, one line each (the CLI
    runs this first). A KERNELCACHE_* variable kernelcache does not read is one warning."""
    configfile.ensure_loaded(KNOWN, ConfigError)
    configfile.warn_unknown_variables(KNOWN)
    warn_removed()
    problems = []
    for read in _CHECKS:
        try:
            read()
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))

