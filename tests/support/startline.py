"""A start line for processes a test starts together (imported by the children too: no imports
of its own beyond the standard library).

Each child imports what it needs, says it is ready (a file in the ``gate`` directory), then waits
until ``parties`` children are: they go at once (within one poll, half a millisecond), the worst
case for sharing. A fixed start time a few seconds ahead did the same by waiting out the slowest
import it guessed: seconds lost on a quiet machine, too short on a busy one.
"""

from __future__ import annotations

import os
import time


def arrive(gate: str, parties: int, timeout: float = 120.0) -> None:
    """Say this process is ready, then wait until ``parties`` processes have (TimeoutError past
    ``timeout``: one of them died or never got here). One arrival per process (named by its pid)."""
    os.makedirs(gate, exist_ok=True)
    open(os.path.join(gate, str(os.getpid())), "x").close()
    deadline = time.monotonic() + timeout
    while len(os.listdir(gate)) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(os.listdir(gate))} of {parties} processes reached {gate}")
        time.sleep(0.0005)
