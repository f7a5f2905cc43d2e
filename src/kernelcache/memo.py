"""Bounded per-process memos: a plain dict, emptied when it reaches its limit.

Crude but bounded: every memo of kernelcache only saves work (a hash, a stat, a parse), so
forgetting everything at once costs a few recomputations and never a wrong answer. Callers
that share a memo between threads hold their own lock around it.
"""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(memo: dict[K, V], key: K, value: V, limit: int) -> V:
    """Store ``memo[key] = value``, first emptying the memo if it holds ``limit`` entries; return value."""
    if len(memo) >= limit:
        memo.clear()
    memo[key] = value
    return value
