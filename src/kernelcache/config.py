"""Every environment variable kernelcache reads, parsed and validated in one place.

Each is read per call, not at import, so a process (or a test) may change it at any time.
A bad value raises ValueError at once, naming the variable and what it accepts.
"""

from __future__ import annotations

import os

_TRUE = ("1", "true", "yes", "on")


def cache_dir() -> str:
    """``KERNELCACHE_DIR`` if set, else the platform's user cache dir for "kernelcache"."""
    env = os.environ.get("KERNELCACHE_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_cache_dir("kernelcache", appauthor=False)


def disabled() -> bool:
    """``KERNELCACHE_DISABLE`` is 1/true/yes/on: compile_program compiles without any cache."""
    return os.environ.get("KERNELCACHE_DISABLE", "").strip().lower() in _TRUE


def wait_timeout_s() -> float:
    """``KERNELCACHE_WAIT_TIMEOUT`` (seconds a caller waits for a peer's compile) if set, else 600."""
    raw = os.environ.get("KERNELCACHE_WAIT_TIMEOUT", "")
    try:
        return float(raw) if raw.strip() else 600.0
    except ValueError:
        raise ValueError(f"KERNELCACHE_WAIT_TIMEOUT must be a number of seconds, got {raw!r}") from None
