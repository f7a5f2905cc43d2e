"""The header pass beside the compile: NVRTC's front end (compilers.header_pass) run in a child
forked for it while this process's thread runs the plain compile, so a miss costs about a plain
compile's wall time where a core is free (the pass alone is 0.5-0.9x of the compile, run after
it: the miss was 1.5-2.2x a plain compile, bench_real_kernels.py's cold phase).

Why a child and not a thread: after one traced compile that fails, NVRTC drops header events
from every later trace in the process (compilers.header_pass); the pass runs before the compile
is known to succeed, so its failure must end with the process it ran in. The child inherits the
loaded NVRTC (no load, no driver probe of its own), runs the pass and leaves by ``os._exit``.

It is only a way of running the same pass: wherever it cannot run (one usable core, no slot free
or another process waiting for one, another compile of ours running in this process, no fork),
the pass runs after the compile as before (``start`` returns None), and a child that fails,
dies or outlives its bound is replaced by that pass too (``finish``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from kernelcache.runners import compilers, slots

# A pass reads what the compile read and generates no code: it takes less time than the compile
# did (measured on the corpus: 0.5-0.9x). A child still running well past that is stuck (a fork
# while a compile that is not ours held NVRTC's lock, see choice._Gate): it is killed and the
# pass runs here instead. The floor keeps a loaded machine from retiring a healthy child
# often; one retired early costs the pass here, never a wrong result.
_BOUND_FACTOR, _BOUND_FLOOR_S = 3.0, 2.0


class Beside:
    """A forked child running one header pass; its slot is held until the child is reaped."""

    def __init__(self, pid: int, slot: slots.Slot | None, args: tuple[str, bytes, tuple[bytes, ...], str]) -> None:
        self.pid, self.slot, self.args = pid, slot, args
        self.started = time.monotonic()

    def finish(self, compile_seconds: float) -> None:
        """Wait for the child. Where it died or ran past its bound (killed then), run the pass
        here; where the pass itself failed (a header changed since the compile read it), the
        child removed its trace and the variant refuses to be stored, as after the pass here."""
        outcome = self._outcome(self.started + max(_BOUND_FLOOR_S, _BOUND_FACTOR * compile_seconds))
        if outcome == "lost":
            compilers.remove_trace(self.args[3])  # a killed child's trace may be half written
            compilers.header_pass(*self.args)

    def cancel(self) -> None:
        """The compile failed: its pass is of no use (the flow removes the trace)."""
        self._kill()

    def _outcome(self, deadline: float) -> str:
        """ "ok", "failed" (the pass failed: the child exited 1) or "lost" (it died, or was
        killed at ``deadline``)."""
        pause = 0.0005
        try:
            while True:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.pid = 0
                    code = os.waitstatus_to_exitcode(status)
                    return "ok" if code == 0 else "failed" if code == 1 else "lost"
                if time.monotonic() >= deadline:
                    self._kill()
                    return "lost"
                time.sleep(pause)  # a child has no fd to wait on; polls are cheap next to a compile
                pause = min(pause * 2, 0.01)
        finally:
            self._release()

    def _kill(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = 0
        self._release()

    def _release(self) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None


def start(request: Any, trace_path: str | None, gate: Any) -> Beside | None:
    """A child running the header pass of ``request`` into ``trace_path``, forked now through
    ``gate`` (choice._COMPILING), or None where the pass must run after the compile instead."""
    if trace_path is None or request.code_type != "c++" or slots.usable_cores() < 2:
        return None
    slot = None
    if slots.enabled():
        if slots.others_wait():  # the node's cores are spoken for: one compile, one core
            return None
        slot = slots.try_take()
        if slot is None:
            return None
    source, options, _ = compilers.plan_compile(request, None)
    args = (str(source), options._name, tuple(options.as_bytes("nvrtc", request.target_type)), trace_path)
    from kernelcache.keys.toolchain import library_file

    library_file("nvrtc", load=True)  # loaded before the fork: the child loads nothing
    from cuda.bindings import nvrtc  # noqa: F401 - imported before the fork, for the same reason

    try:
        pid = gate.try_fork()
    except OSError:
        pid = None
    if pid is None:
        if slot is not None:
            slot.release()
        return None
    if pid == 0:  # the child: the pass, and out (no atexit, no finalizers, no flush of the parent's buffers)
        code = 1
        try:
            code = 0 if compilers.header_pass(*args) else 1
        finally:
            os._exit(code)
    return Beside(pid, slot, args)
