"""The ``kernelcache`` logger: what the cache did, for whoever configures logging.

DEBUG: one line per hit or miss (entry name prefix, timings). INFO: compiles, evictions.
WARNING: a store degraded (an I/O error, a corrupt entry, an unreachable server), besides
the KernelCacheWarning. kernelcache never prints and never configures logging: a
NullHandler keeps Python's last-resort handler from writing WARNINGs to stderr when the
application configured nothing (the library convention of the logging HOWTO).
"""

from __future__ import annotations

import logging

logger = logging.getLogger("kernelcache")
logger.addHandler(logging.NullHandler())

