"""Strict mode and explained misses: what compile_program does on a miss before it compiles.

``KERNELCACHE_REQUIRE_HIT=1``: a miss raises :class:`CacheMissError` instead of compiling;
``=warn``: it compiles, with one KernelCacheWarning per miss. Every miss, strict or not,
is explained (sourceindex.py): the text goes to ``CompileInfo.miss_reason``, to the
``kernelcache`` logger at INFO and, when raised, to ``CacheMissError.explanation``.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache.compile import sourceindex
from kernelcache.compile.flight import SingleFlight
from kernelcache.compile.metadata import kernel_names
from kernelcache.log import INFO, logger
from kernelcache.stores.base import KernelCacheWarning
from kernelcache.stores.safe import count

if TYPE_CHECKING:
    from kernelcache.compile.lookup import Lookup
    from kernelcache.runners.beside import Job

__all__ = ["CacheMissError", "MissBooks", "on_miss", "on_triton_miss", "on_uncached", "stored"]

_INDEX_LOCK_S = 5.0  # the index's read-merge-write takes milliseconds; past this, write without the lock


class CacheMissError(RuntimeError):
    """A compile_program call missed while ``KERNELCACHE_REQUIRE_HIT=1``: nothing was compiled.

    ``explanation``: why it missed (the nearest stored entry of the same source and the key
    components that differ, or "no entry for this source").
    """

    def __init__(self, explanation: str, what: str = "") -> None:
        self.explanation = explanation
        self.what = what
        super().__init__(
            f"kernelcache: a cache miss{' for ' + what if what else ''} with KERNELCACHE_REQUIRE_HIT=1 "
            f"(nothing compiled): {explanation}. To have it: run once with KERNELCACHE_REQUIRE_HIT unset "
            "(or =warn), or record a run (KERNELCACHE_RECORD=lock.json) and `kernelcache warm lock.json` "
            "into this cache or a bundle (KERNELCACHE_BUNDLES)"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # picklable (compile_many's errors cross processes)
        return (type(self), (self.explanation, self.what))


def _what(look: Lookup) -> str:
    """The kernel(s) a miss is for, by name (name expressions, else the source's __global__
    functions), and the compile: ``saxpy (c++ -> cubin for sm_90)``."""
    request = look.request
    arch = getattr(request.options, "arch", None)
    names = request.name_expressions or kernel_names(request.code, None)
    compile_ = f"{request.code_type} -> {request.target_type}" + (f" for {arch}" if arch else "")
    text = [n.decode("latin-1") if isinstance(n, bytes) else str(n) for n in names]
    shown = ", ".join(text[:4]) + (", ..." if len(text) > 4 else "")
    return f"{shown} ({compile_})" if shown else compile_


def _apply(mode: str | None, reason: str, what_of: Callable[[], str]) -> None:
    """Log the miss at INFO, then raise or warn as ``mode`` says. ``what_of`` names the
    kernel: called only when something shows it (it parses the source)."""
    if mode is None and not logger.isEnabledFor(INFO):
        return
    what = what_of()
    logger.info("miss (%s): %s", what, reason)
    if mode == "raise":
        raise CacheMissError(reason, what)
    if mode == "warn":
        warnings.warn(
            f"kernelcache: a cache miss for {what}, compiling: {reason}", KernelCacheWarning, _outside_level()
        )


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _outside_level() -> int:
    """The stacklevel of the first frame outside kernelcache (the caller's line, however deep the flow)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def on_miss(look: Lookup) -> str:
    """Explain this miss (log it at INFO); raise or warn as KERNELCACHE_REQUIRE_HIT says; the reason."""
    return _explained(look, config.require_hit())


def _explained(look: Lookup, mode: str | None) -> str:
    reason = sourceindex.explain(look)
    _apply(mode, reason, lambda: _what(look))
    return reason


class MissBooks:
    """A miss's bookkeeping: the miss counted and explained (the source index read, on_miss)
    beside the compile where it can, and its stored key put first in the source's index.

    The count and the explanation decide nothing that is compiled, stored or returned: they
    run on a kept thread (runners.beside) while the compile runs. ``start`` hands them over,
    called by the runner right before the compiler takes over (the GIL then released);
    started earlier, that thread took the GIL at each system call this one made before the
    compile (the node slot's open: 0.3 ms of a small kernel's miss here, py-spy). ``reason``
    joins them, and ``close`` does in any case: nothing of it outlives the call.
    KERNELCACHE_REQUIRE_HIT (raise, warn) needs the explanation before the compile: then it
    runs here, first. Where no thread took it (a compile that raised before it started, an
    interpreter shutting down), ``reason`` runs it here, after.

    The index is written only after the entry was (``stored``), on this thread. Written
    beside the compile (before it was known to be stored), it named keys with no entry: a
    process killed during its compile left one for good, and a concurrent miss of the same
    source was explained against a compile that then failed.
    """

    def __init__(self, look: Lookup) -> None:
        self._look, self._reason = look, ""
        self._job: Job | None = None
        self._pending = config.require_hit() is None  # start() still to hand the work over
        if not self._pending:
            count(look.cache, misses=1)
            self._reason = on_miss(look)  # KERNELCACHE_REQUIRE_HIT=1 raises here

    def start(self) -> None:
        """Hand the count and the explanation to a kept thread, once (later calls do nothing);
        at interpreter shutdown they are left for ``reason``, after the compile."""
        if not self._pending:
            return
        from kernelcache.runners.beside import on_a_thread

        try:
            self._job = on_a_thread(self._beside)
        except RuntimeError:  # the interpreter is shutting down: no thread can start
            return
        self._pending = False

    def _beside(self) -> None:
        count(self._look.cache, misses=1)  # counted whatever the compile does: a failed one is a miss too
        # The mode is the one read at the miss's start (None: neither raise nor warn), not the
        # environment's now: a raise after the compile would say "nothing compiled".
        self._reason = _explained(self._look, None)

    def reason(self) -> str:
        """Why this call missed (joins the work beside the compile; re-raises what it raised)."""
        if self._pending:  # nothing started it (the compile raised first, or at shutdown): here
            self._pending = False
            self._beside()
        job = self._job
        if job is not None:
            job.result()  # an interrupted wait (Ctrl-C) leaves the job to close(), joined there
            self._job = None
        return self._reason

    def stored(self, key: bytes) -> None:
        """The entry was stored under ``key``: index it (the index explains later misses)."""
        self.reason()
        stored(self._look, key)

    def close(self) -> None:
        """Join the work beside the compile (nothing of it outlives the call)."""
        self.reason()


def on_uncached(disabled: bool) -> str:
    """A call that compiles with no cache at all (disabled, or none usable): a miss like any other."""
    why = "the cache is disabled (KERNELCACHE_DISABLE=1)" if disabled else "no usable cache (see the warning above)"
    _apply(config.require_hit(), why, lambda: "a call without a cache")
    return why


def on_triton_miss(triton_key: str, filename: str) -> None:
    """Triton found no compiled kernel under its key: raise or warn as KERNELCACHE_REQUIRE_HIT says.

    Triton's key already covers its source, options and toolchain; there is no nearer entry to name.
    """
    name = filename[: -len(".json")] if filename.endswith(".json") else filename
    why = f"no entry for this Triton kernel (Triton key {triton_key})"
    _apply(config.require_hit(), why, lambda: f"Triton's {name}")


def stored(look: Lookup, key: bytes) -> None:
    """Add the entry just stored under ``key`` to its source's index, under the index's own flight.

    That flight is held inside the entry's own (a different key), for milliseconds, and
    waits _INDEX_LOCK_S at most: whatever its outcome, the index is then written.
    """
    flight = SingleFlight.for_store(look.cache, sourceindex.index_key(look), _INDEX_LOCK_S)
    with flight.hold():
        sourceindex.add(look, key)
