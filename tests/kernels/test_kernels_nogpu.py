"""KernelCache on a machine without a GPU: one clear line, not a traceback through the driver loader."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ARCH, _gpu_available

CODE = f"""
from cuda.core import ProgramOptions
from kernelcache import KernelCache
KernelCache().get_kernel('extern "C" __global__ void f() {{}}', "f", options=ProgramOptions(arch={ARCH!r}), device=0)
"""


@pytest.mark.skipif(_gpu_available(), reason="this machine has a GPU: the kernel loads")
def test_kernel_cache_without_a_gpu_says_so_in_one_line(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120,
        env={**os.environ, "KERNELCACHE_DIR": str(tmp_path)},
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: kernelcache.KernelCache needs a CUDA GPU: ")
    assert "compile_program" in last
    assert "pathfinder" not in proc.stderr and "The above exception" not in proc.stderr


def test_one_str_as_name_expressions_raises_typeerror_first() -> None:
    # Read as a sequence, "k<float>" was the name expressions "k", "<", "f"...: the same
    # TypeError as compile_program and compile_many give, before any device is asked for.
    from kernelcache import KernelCache

    kc = KernelCache()
    with pytest.raises(TypeError, match="single str"):
        kc.get_kernel("x", "k", name_expressions="k<float>")
    with pytest.raises(TypeError, match="request #1: name_expressions must be a sequence"):
        kc.get_kernels([{"code": "x", "name": "k"}, {"code": "x", "name": "k", "name_expressions": "k<float>"}])
