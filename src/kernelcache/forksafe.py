"""Process-local state across fork(): a child starts with fresh locks and none of the parent's tallies.

Only the forking thread exists in a child. A lock that another thread held at that moment
stays held there forever (the child's first hit on a store that thread was using hung),
and a tally of counts not yet written out would be written by both processes (counted
twice). So every object owning such state registers here, and in the child its
``after_fork_in_child()`` replaces its locks and drops what the parent still writes out;
state held by a module registers a function.

A multiprocessing worker started by 'fork' ends with ``os._exit``: atexit never runs there.
The functions given to :func:`at_exit` run at interpreter exit and also when such a worker
finishes, so its last counts are written like any process's.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class ForkAware(Protocol):
    def after_fork_in_child(self) -> None:
        """Replace process-local locks; drop tallies that the parent writes out."""


_objects: weakref.WeakSet[Any] = weakref.WeakSet()
_functions: list[Callable[[], None]] = []
_exit_functions: list[Callable[[], None]] = []


def reset_in_child(obj: ForkAware) -> None:
    """Call ``obj.after_fork_in_child()`` in every child forked while obj lives."""
    _objects.add(obj)


def reset_function_in_child(func: Callable[[], None]) -> None:
    """Call func in every child forked from now on (for state a module holds)."""
    _functions.append(func)


def at_exit(func: Callable[[], None]) -> None:
    """Run func at interpreter exit, and at the end of a multiprocessing worker made by fork."""
    atexit.register(func)
    _exit_functions.append(func)


def _run_exit_functions() -> None:
    for func in _exit_functions:
        try:
            func()
        except Exception:  # noqa: S110 - an exit hook must not stop the others
            pass


class _Mark:
    """What multiprocessing's after-fork registry holds on to (it keeps weak references)."""


_MARK = _Mark()


def _finalize_worker(_: object) -> None:
    # Runs inside a multiprocessing worker's bootstrap, after it cleared the finalizers it
    # inherited: a finalizer registered now runs when the worker's target returns.
    from multiprocessing import util

    util.Finalize(None, _run_exit_functions, exitpriority=0)


def _after_fork_in_child() -> None:
    for func in _functions:
        func()
    for obj in list(_objects):
        obj.after_fork_in_child()
    # A process that forks multiprocessing workers has imported multiprocessing already.
    util = sys.modules.get("multiprocessing.util")
    if util is not None and _exit_functions:
        util.register_after_fork(_MARK, _finalize_worker)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
