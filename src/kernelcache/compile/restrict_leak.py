"""NVRTC's ``--restrict`` leak: which compiles of this process may be stored.

NVRTC keeps ``--restrict`` on for the rest of a process once one compile used it (there is
no reset call): every later C++ compile in that process, on any thread, is built as if
``restrict=True``, which a fresh process would not produce (``ld.global.nc`` loads where
the pointers may alias). kernelcache compiles ``restrict=True`` in a worker process
(runners.py). Where one ran in this process instead (no worker could start), every later
C++ compile that ran in this process without ``restrict=True`` is returned but not stored,
with one warning. A compile that ran in a worker never passes through ``in_process``, so it
is stored as usual. A forked child keeps the mark: NVRTC's state is copied with the memory.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelcache.compile.request import CompileRequest

REASON = (
    "this process compiled with restrict=True in-process (no compiler worker could start), and NVRTC keeps "
    "--restrict on for every later compile in it (its later compiles would not match a fresh process's)"
)

_leaked = False  # a restrict=True compile ran in this process: NVRTC has --restrict on for good
_thread = threading.local()  # exposed: this thread's last compile ran here after the leak


def _asks_restrict(request: CompileRequest) -> bool:
    return request.code_type == "c++" and bool(getattr(request.options, "restrict", False))


def start() -> None:
    """Before a compile that may be stored: nothing of this thread's earlier compiles counts."""
    _thread.exposed = False


@contextlib.contextmanager
def in_process(request: CompileRequest) -> Iterator[None]:
    """Around every compile that runs in this process (compilers.run_compiler)."""
    global _leaked
    if _asks_restrict(request):
        # Marked before NVRTC sees the flag: a compile on another thread that ends after
        # this point may have been built with --restrict, and it reads the mark after it ends.
        _leaked = True
    yield
    # Read after the compile: a restrict=True compile that started while this one ran makes
    # it exposed, one that starts after this point cannot have reached it.
    _thread.exposed = getattr(_thread, "exposed", False) or _leaked


def why_not_stored(request: CompileRequest) -> str:
    """REASON when this thread's compile of ``request`` (since start()) may carry the leak, else ""."""
    if request.code_type != "c++" or _asks_restrict(request) or not getattr(_thread, "exposed", False):
        return ""
    return REASON
