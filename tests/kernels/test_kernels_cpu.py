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


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"code": "x"}, r"request #0 needs \['name'\]"),
        ({"code": "x", "name": "k", "logs": None}, r"request #0 has unknown field\(s\) \['logs'\]"),
    ],
)
def test_get_kernels_checks_requests_before_touching_a_device(bad, match) -> None:
    with pytest.raises(TypeError, match=match):
        KernelCache().get_kernels([bad])
    assert KernelCache().get_kernels([]) == []
