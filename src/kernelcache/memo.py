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


_instances: dict[tuple[type, type], bool] = {}  # (type, ABC) -> True, once isinstance said so


def is_instance(obj: object, abc_class: type) -> bool:
    """``isinstance(obj, abc_class)`` for an abc.ABC, its yes remembered by ``type(obj)``.

    An ABC's isinstance goes through ABCMeta.__instancecheck__ (~0.15 us, twice on every hit);
    a dict look-up answers it again. Only yes is remembered: a type that is an instance stays
    one (register() adds virtual subclasses, nothing takes them away), a no may become a yes.
    An object whose ``__class__`` is not its type (a proxy: weakref.proxy, wrapt's ObjectProxy)
    is answered afresh every time: isinstance looks at ``__class__`` too, and two proxies of
    one type may stand for objects of different classes.
    """
    cls = type(obj)
    key = (cls, abc_class)
    if key in _instances:
        return True
    if isinstance(obj, abc_class):
        if obj.__class__ is cls:
            remember(_instances, key, True, 256)
        return True
    return False
