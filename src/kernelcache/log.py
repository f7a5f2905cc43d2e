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

import logging
import threading
import warnings

from kernelcache import forksafe

logger = logging.getLogger("kernelcache")
logger.addHandler(logging.NullHandler())



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
