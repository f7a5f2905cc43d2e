"""On a GPU: Program.compile(cache=<kernelcache store>) hits, and the kernel from the hit runs.

Run: PYTHONPATH=src python3 -m pytest -q -m gpu tests/test_gpu_interop.py
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kernelcache import FileStreamProgramCache, InMemoryProgramCache, TieredProgramCache

pytestmark = pytest.mark.gpu

SRC = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""


def _run_scale(dev, kernel, n: int = 1024) -> np.ndarray:
    from cuda.core import LaunchConfig, LegacyPinnedMemoryResource, launch

    stream = dev.create_stream()
    host = LegacyPinnedMemoryResource().allocate(4 * n, stream=stream)
    view = np.frombuffer((ctypes.c_float * n).from_address(int(host.handle)), dtype=np.float32)
    view[:] = np.arange(n, dtype=np.float32)
    buf = dev.allocate(4 * n, stream=stream)
    buf.copy_from(host, stream=stream)
    launch(stream, LaunchConfig(grid=(n + 127) // 128, block=128), kernel, buf, np.float32(3.0), np.int32(n))
    buf.copy_to(host, stream=stream)
    stream.sync()
    return view.copy()


@pytest.mark.parametrize("target", ["cubin", "ptx"])
@pytest.mark.parametrize("kind", ["file", "memory", "tiered"])
def test_program_compile_hit_from_a_kernelcache_store_loads_and_runs(tmp_path, kind: str, target: str) -> None:
    from cuda.core import Device, Program, ProgramOptions

    dev = Device(0)
    dev.set_current()
    major, minor = dev.compute_capability
    options = ProgramOptions(arch=f"sm_{major}{minor}", name="interop_scale")
    store = {
        "file": lambda: FileStreamProgramCache(str(tmp_path / "fs")),
        "memory": InMemoryProgramCache,
        "tiered": lambda: TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(str(tmp_path / "t"))]),
    }[kind]()

    def compile_once() -> object:
        program = Program(SRC, "c++", options=options)
        try:
            return program.compile(target, cache=store)
        finally:
            program.close()

    miss = compile_once()
    hit = compile_once()
    stats = store.stats()
    assert (stats["misses"], stats["hits"], stats["stores"]) == (1, 1, 1), stats
    assert bytes(hit.code) == bytes(miss.code)
    out = _run_scale(dev, hit.get_kernel("scale"))  # the kernel of the HIT, loaded and launched
    np.testing.assert_array_equal(out, np.arange(1024, dtype=np.float32) * 3.0)
