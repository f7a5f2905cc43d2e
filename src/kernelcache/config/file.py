"""The config file: ``KERNELCACHE_*`` values written once for every process of a user or host.

``KERNELCACHE_CONFIG`` names it (default ``<user config dir>/kernelcache/config.toml``). Each
key is a variable's name, with or without the ``KERNELCACHE_`` prefix, in either case, ``-``
or ``_`` (``max_size = "20GB"``, ``redis-url = "redis://cache:6379/0"``,
``allow_shared = true``). The environment wins over the file: a value from the file is put
into the process's environment only where the variable is unset, so every reader in
kernelcache.config (and every child process) sees one set of values. Which value came from where is
remembered for ``kernelcache config``.

The file is read again when ``KERNELCACHE_CONFIG`` changes, not when the file does: a
process reads it once.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from typing import Any

from kernelcache import forksafe
from kernelcache.log import KernelCacheWarning, WarnOnce, logger

PREFIX = "KERNELCACHE_"
_UNLOADED = object()
_lock = threading.Lock()
_loaded_for: object = _UNLOADED  # the KERNELCACHE_CONFIG value the file was read for
_loaded_path: str | None = None
_injected: dict[str, str] = {}  # variable -> the text this file put into the environment
_unknown = WarnOnce()  # one warning per unknown variable name
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
if not isinstance(_ENV_DATA, dict):
    _ENV_DATA = None
_loaded_bytes: object = _UNLOADED  # _loaded_for as os.environ's backing dict holds it
_CONFIG_KEY = os.fsencode("KERNELCACHE_CONFIG")


def default_path() -> str:
    """The config file read when KERNELCACHE_CONFIG is unset: platformdirs' user config dir."""
    return os.path.join(user_dir("config"), "config.toml")


def user_dir(kind: str) -> str:
    """platformdirs' user ``kind`` ("config" or "cache") directory for kernelcache.

    Where every platformdirs >= 3 answers the same (Linux, the XDG variable unset, an absolute
    HOME: ~/.config/kernelcache, ~/.cache/kernelcache), without importing it: a fresh process's
    first hit reads the config file's path, and the default cache's.
    """
    environ = os.environ
    xdg = "XDG_CONFIG_HOME" if kind == "config" else "XDG_CACHE_HOME"
    if (
        sys.platform.startswith("linux")
        and xdg not in environ
        and "ANDROID_DATA" not in environ
        and os.path.isabs(environ.get("HOME", ""))
    ):
        return os.path.join(os.path.expanduser(f"~/.{kind}"), "kernelcache")
    import platformdirs

    find = platformdirs.user_config_dir if kind == "config" else platformdirs.user_cache_dir
    return find("kernelcache", appauthor=False)


def _config_env() -> str | None:
    if isinstance(_ENV_DATA, dict):
        raw = _ENV_DATA.get(_CONFIG_KEY)
        return None if raw is None else os.fsdecode(raw)
    return os.environ.get("KERNELCACHE_CONFIG")


def ensure_loaded(known: tuple[str, ...], error: type[Exception]) -> None:
    """Read the config file if ``KERNELCACHE_CONFIG`` changed since it was read (cheap otherwise).

    ``known``: every variable name kernelcache reads; ``error``: raised for a file that cannot
    be used (config.ConfigError), naming the file and what is wrong.
    """
    global _loaded_for, _loaded_path, _loaded_bytes
    if _ENV_DATA is not None and _ENV_DATA.get(_CONFIG_KEY) == _loaded_bytes:
        return  # the hit path asks several times per call: one look-up, no decoding
    raw = _config_env()
    if raw == _loaded_for:
        return
    with _lock:
        if raw == _loaded_for:
            return
        _unload()
        path = os.path.expanduser(raw) if raw else default_path()
        if raw and not os.path.isfile(path):
            raise error(f"KERNELCACHE_CONFIG={raw!r}: no such file; create it or unset the variable")
        values = _read(path, error) if os.path.isfile(path) else {}
        for key, value in values.items():
            name = _variable(key)
            if name not in known:
                _warn_unknown(name, known, f"in {path}")
                continue
            text = _text(value, key, path, error)
            if name not in os.environ:
                os.environ[name] = text
                _injected[name] = text
        _loaded_for, _loaded_path = raw, path if values else None
        _loaded_bytes = None if raw is None else os.fsencode(raw)


def _unload() -> None:
    # A different file now: take back what the previous one set (unless a program changed it since).
    for name, text in _injected.items():
        if os.environ.get(name) == text:
            del os.environ[name]
    _injected.clear()


def _read(path: str, error: type[Exception]) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, ValueError) as exc:
        why = f"the config file {path} cannot be used ({exc}); fix it, or point KERNELCACHE_CONFIG elsewhere"
        raise error(why) from None


def _variable(key: str) -> str:
    name = key.strip().upper().replace("-", "_")
    return name if name.startswith(PREFIX) else PREFIX + name


def _text(value: object, key: str, path: str, error: type[Exception]) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise error(f"{path}: {key} = {value!r} is not a string, number or true/false")


def source(name: str) -> str:
    """Where the value in force of variable ``name`` came from: environment, config file, default."""
    if name in _injected and os.environ.get(name) == _injected[name]:
        return f"config file {_loaded_path}"
    return "environment" if name in os.environ else "default"


def file_in_use() -> str | None:
    """The config file whose values are in force, if any held values."""
    return _loaded_path


def warn_unknown_variables(known: tuple[str, ...]) -> None:
    """One warning per ``KERNELCACHE_*`` variable of the environment that kernelcache does not read."""
    for name in sorted(os.environ):
        if name.startswith(PREFIX) and name not in known:
            _warn_unknown(name, known, "in the environment")


def _warn_unknown(name: str, known: tuple[str, ...], where: str) -> None:
    if not _unknown.first(name):
        return
    import difflib  # only for a warning: not imported by every process that reads a setting

    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f": did you mean {close[0]}?" if close else " (see `kernelcache config` for the known ones)"
    logger.warning("%s", f"{name} {where} is not a variable kernelcache reads{hint}")
    warnings.warn(f"kernelcache: {name} {where} is not a variable kernelcache reads{hint}", KernelCacheWarning, 4)


def _reset_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent's thread may have held it at the fork


forksafe.reset_function_in_child(_reset_in_child)
