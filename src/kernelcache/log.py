"""The ``kernelcache`` logger: what the cache did, for whoever configures logging.

DEBUG: one line per hit or miss (entry name prefix, timings). INFO: compiles, evictions.
WARNING: a store degraded (an I/O error, a corrupt entry, an unreachable server), besides
the KernelCacheWarning. kernelcache never prints and never configures logging: a
NullHandler keeps Python's last-resort handler from writing WARNINGs to stderr when the
application configured nothing (the library convention of the logging HOWTO).

``WarnOnce`` is how every part of kernelcache reports a failing cache: the first time a
cause happens, one log line and one KernelCacheWarning; after that, silence (a cache that
fails on every call must not flood the program).
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any

from kernelcache import forksafe

if TYPE_CHECKING:
    import logging

DEBUG, INFO, WARNING = 10, 20, 30  # logging's levels, without importing it


class _Logger:
    """The ``kernelcache`` logging.Logger, made on first use: importing logging costs a few
    milliseconds that a process whose hits log nothing never needs.

    Until someone imports logging (the application, to configure it; or a WARNING of ours),
    no handler or level can have been set, so the logger is Python's default one: WARNING
    and above enabled. ``isEnabledFor`` answers that without importing logging; anything
    else is the real logger's.
    """

    _real: logging.Logger | None = None

    def _get(self) -> logging.Logger:
        real = self._real
        if real is None:
            import logging

            real = logging.getLogger("kernelcache")  # one logger per name, whoever asks first
            # Race: two threads' first uses may both get here; a second NullHandler is harmless.
            if not any(type(h) is logging.NullHandler for h in real.handlers):
                real.addHandler(logging.NullHandler())
            self._real = real
        return real

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging.Logger's name
        if self._real is None and "logging" not in sys.modules:
            return level >= WARNING
        return self._get().isEnabledFor(level)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


logger: logging.Logger = _Logger()  # type: ignore[assignment]  # a logging.Logger to every caller



class KernelCacheWarning(RuntimeWarning):
    """A cache problem that was degraded to a miss or a dropped write."""


class WarnOnce:
    """Remembers which causes were reported; thread-safe. One per owner (a store, a module)."""

    def __init__(self, prefix: str = "kernelcache") -> None:
        self._prefix = prefix  # what the warning's text starts with
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        forksafe.reset_in_child(self)

    def after_fork_in_child(self) -> None:
        """A fresh lock in a forked child (another thread may have held this one)."""
        self._lock = threading.Lock()

    def first(self, cause: str) -> bool:
        """True the first time ``cause`` is seen, False ever after."""
        with self._lock:
            if cause in self._seen:
                return False
            self._seen.add(cause)
            return True

    def warn(self, cause: str, message: str, *, stacklevel: int = 2, origin: str = "", log: bool = True) -> bool:
        """Report ``message`` if ``cause`` is new: a log line (led by ``origin``, unless ``log``
        is False) and a KernelCacheWarning (``stacklevel`` as warnings.warn counts it from
        the caller). Returns whether it reported."""
        if not self.first(cause):
            return False
        if log:
            logger.warning("%s%s", f"{origin}: " if origin else "", message)
        warnings.warn(f"{self._prefix}: {message}", KernelCacheWarning, stacklevel=stacklevel + 1)
        return True
