"""The racy-timestamp rule (git's index, ccache's inode cache), one copy for every memo of file state.

A memo that trusts a file's (inode, size, mtime, ctime) to stand for its content must not keep a
state whose timestamps a later change could carry again: a same-size rewrite within one tick of
the filesystem's clock (or a freed inode reused in that tick) leaves all four unchanged. So a
state is remembered only where the file has not changed since a moment taken before it was read
(``changed_since(st, now_ns())`` is False). headers.digests and headers.index memoise header
digests and directory listings by it; stores.file.payloads keeps verified entries by it.
"""

from __future__ import annotations

import os
import time

__all__ = ["changed_since", "now_ns"]

# File timestamps come from the kernel's coarse clock (CLOCK_REALTIME_COARSE, one tick of
# 1-10 ms behind time.time_ns()), or a finer one on kernels with multigrain timestamps: a
# change at or after a coarse reading is stamped at or after it. Filesystems of 1 s (ext3
# with 128-byte inodes, many network filesystems) or 2 s (FAT) granularity stamp a change up
# to 2 s before the moment it happened. Which granularity a file's filesystem has shows in its
# ctime, never in its mtime: the kernel sets the ctime from its clock on every change, while an
# mtime can be any value a copy kept (cp -p, copytree, tar and wheel extraction keep whole
# seconds). A file whose ctime is a whole second is taken for a coarse filesystem (on a fine
# one, one ctime in 10^9 lands there: a compile not stored, never a wrong one).
_CLOCK_REALTIME_COARSE = 5  # Linux; time does not export the name
_COARSE_FS_MARGIN_NS = 2_000_000_000


def now_ns() -> int:
    """The current time as the filesystem stamps files (the kernel's coarse clock on Linux)."""
    try:
        return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
    except (AttributeError, OSError):
        return time.time_ns() - 20_000_000  # elsewhere: assume a tick of up to 20 ms


def changed_since(st: os.stat_result, since_ns: int) -> bool:
    """Whether the file (or directory) may have changed at or after ``since_ns`` (a now_ns()):
    what its timestamps say, at its filesystem's granularity (the ctime's)."""
    return max(st.st_mtime_ns, st.st_ctime_ns) >= since_ns - _margin(st)


def only_ctime_since(st: os.stat_result, since_ns: int) -> bool:
    """Whether the ctime says a change at or after ``since_ns`` and the mtime does not (at the
    same granularity as changed_since): a rename, chmod or chown, or a copy that kept an old
    mtime. A directory whose entries changed has both moved."""
    return st.st_ctime_ns >= since_ns - _margin(st) > st.st_mtime_ns


def _margin(st: os.stat_result) -> int:
    """How long before a change its filesystem may stamp it (see the granularity note above)."""
    return _COARSE_FS_MARGIN_NS if st.st_ctime_ns % 1_000_000_000 == 0 else 0
