"""On a GPU: a Triton kernel and a CuPy kernel compiled once, shipped as a bundle, and served to
fresh processes whose own caches are empty: zero compiles, nothing stored, right results.

    pytest -m gpu -s tests/stores/bundle/test_bundles_gpu.py     (-s prints the bundle's figures)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import gpu_child as _child  # one fresh-process runner for the GPU children

pytestmark = pytest.mark.gpu


def _env(root: str, tag: str, **extra: str) -> dict[str, str]:
    return {
        "KERNELCACHE_DIR": os.path.join(root, f"kc-{tag}"),
        "TRITON_CACHE_MANAGER": "kernelcache.triton:KernelCacheManager",
        "TRITON_CACHE_DIR": os.path.join(root, f"triton-own-{tag}"),  # must stay unused
        "CUPY_CACHE_DIR": os.path.join(root, f"cupy-own-{tag}"),
        **extra,
    }


def test_triton_and_cupy_kernels_served_from_a_bundle_compile_nothing(tmp_path):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    root = str(tmp_path)
    build = _env(root, "build")
    assert _child("triton", build)["compiled"] == 1
    assert _child("cupy", build)["compiled"] == 1

    bundle = os.path.join(root, "image.kcb")
    start = time.perf_counter()
    cli = [sys.executable, "-m", "kernelcache", "bundle", "create", bundle, "--cache-dir", build["KERNELCACHE_DIR"]]
    proc = subprocess.run([*cli, "--json"], capture_output=True, text=True)
    create_s = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)

    node = _env(root, "node", KERNELCACHE_BUNDLES=bundle)
    triton = _child("triton", node)
    cupy = _child("cupy", node)
    assert (triton["compiled"], triton["stores"], triton["correct"]) == (0, 0, True), triton
    assert (cupy["compiled"], cupy["stores"], cupy["correct"]) == (0, 0, True), cupy
    for own in ("TRITON_CACHE_DIR", "CUPY_CACHE_DIR"):
        assert not os.path.exists(node[own]) or not os.listdir(node[own])
    entries = os.path.join(node["KERNELCACHE_DIR"], "v2", "entries")
    assert not os.path.exists(entries) or not any(files for _, _, files in os.walk(entries))
    print(
        f"\nbundle create: {report['kernels']} kernels ({report['records']} records), {report['bytes']} bytes, 1 inode, {create_s:.2f} s "
        f"(CLI process included); fresh-process first launch from the bundle: Triton "
        f"{triton['first_launch_s'] * 1e3:.1f} ms, CuPy {cupy['first_launch_s'] * 1e3:.1f} ms"
    )
