"""Triton and CuPy kernels on a real GPU, each in two fresh processes sharing one kernelcache
store: the first compiles, the second compiles nothing and computes the same, right result."""

from __future__ import annotations

import os

import pytest
from helpers import gpu_child as _child

pytestmark = pytest.mark.gpu

def test_triton_kernel_second_process_compiles_nothing(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    env = {
        "KERNELCACHE_DIR": str(tmp_path / "kc"),
        "TRITON_CACHE_MANAGER": "kernelcache.triton:KernelCacheManager",
        "TRITON_CACHE_DIR": str(tmp_path / "triton-own"),  # must stay unused
    }
    cold = _child("triton", env)
    warm = _child("triton", env)
    assert cold["manager"] == warm["manager"] == "kernelcache.triton"
    assert (cold["compiled"], cold["correct"]) == (1, True)
    assert cold["stores"] > 0
    assert (warm["compiled"], warm["cache_hits"], warm["stores"], warm["correct"]) == (0, 1, 0, True)
    assert not os.path.exists(tmp_path / "triton-own") or not os.listdir(tmp_path / "triton-own")


def test_triton_kernel_takes_no_more_files_and_file_bytes_than_in_tritons_own_cache(tmp_path):
    # One real kernel launched by a cold and then a warm process, through each manager: its
    # group, the launcher and cuda_utils modules, and (ours) the tree's own files.
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    from _triton_disk_child import usage

    disk = {}
    for mode in ("triton", "triton-own"):
        root = tmp_path / mode
        env = {"KERNELCACHE_DIR": str(root / "kc"), "TRITON_CACHE_DIR": str(root / "triton")}
        if mode == "triton":
            env["TRITON_CACHE_MANAGER"] = "kernelcache.triton:KernelCacheManager"
        assert _child(mode, env)["compiled"] == 1 and _child(mode, env)["compiled"] == 0
        disk[mode] = usage(str(root))
    ours, theirs = disk["triton"], disk["triton-own"]
    assert ours["files"] <= theirs["files"] and ours["file_bytes"] <= theirs["file_bytes"], (ours, theirs)


def test_templated_cupy_kernel_miss_then_hit_in_a_fresh_process(tmp_path):
    pytest.importorskip("cupy")
    env = {"KERNELCACHE_DIR": str(tmp_path / "kc"), "CUPY_CACHE_DIR": str(tmp_path / "cupy-own")}
    cold = _child("cupy", env)
    warm = _child("cupy", env)
    assert (cold["compiled"], cold["correct"]) == (1, True)
    assert (warm["compiled"], warm["stores"], warm["correct"]) == (0, 0, True)
