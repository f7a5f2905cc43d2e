"""KernelCache argument checks that need no GPU."""

from __future__ import annotations

import pytest

from kernelcache import KernelCache


def test_bad_cache_type() -> None:
    with pytest.raises(TypeError, match="ProgramCacheResource"):
        KernelCache(cache="/tmp/x")  # type: ignore[arg-type]


def test_empty_cache_len_and_clear() -> None:
    kc = KernelCache()
    assert len(kc) == 0
    kc.clear()
    with kc:
        pass
