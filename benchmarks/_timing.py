"""The one timing helper every benchmark uses."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_us(fn: Callable[[], object], repeat: int = 7, number: int = 200) -> float:
    """Median over ``repeat`` runs of the mean time of ``number`` calls, in microseconds."""
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t) / number)
    return statistics.median(runs) * 1e6
