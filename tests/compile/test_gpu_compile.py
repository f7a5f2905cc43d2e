"""On a GPU: kernels loaded from a cache hit launch and compute the right thing."""

from __future__ import annotations

import numpy as np
import pytest

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

pytestmark = pytest.mark.gpu

TEMPLATE = r"""
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _arch(dev) -> str:
    major, minor = dev.compute_capability
    return f"sm_{major}{minor}"


def _run_axpy(dev, kernel, n: int = 1000) -> np.ndarray:
    import ctypes

    from cuda.core import LaunchConfig, LegacyPinnedMemoryResource, launch

    stream = dev.create_stream()
    pinned = LegacyPinnedMemoryResource()
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    bufs = []
    for arr in (x, y):
        h = pinned.allocate(arr.nbytes, stream=stream)
        np.frombuffer((ctypes.c_float * n).from_address(int(h.handle)), dtype=np.float32)[:] = arr
        d = dev.allocate(arr.nbytes, stream=stream)
        d.copy_from(h, stream=stream)
        bufs.append((h, d))
    launch(
        stream,
        LaunchConfig(grid=(n + 255) // 256, block=256),
        kernel,
        np.float32(2.0),
        bufs[0][1],
        bufs[1][1],
        np.int32(n),
    )
    bufs[1][1].copy_to(bufs[1][0], stream=stream)
    stream.sync()
    return np.frombuffer((ctypes.c_float * n).from_address(int(bufs[1][0].handle)), dtype=np.float32).copy()


def test_kernel_from_a_hit_launches_via_symbol_mapping(tmp_path) -> None:
    from cuda.core import Device, ProgramOptions

    dev = Device(0)
    dev.set_current()
    cache = FileStreamProgramCache(tmp_path)
    options = ProgramOptions(arch=_arch(dev))
    compile_program(TEMPLATE, options=options, cache=cache, name_expressions=("axpy<float>",))
    info = CompileInfo()
    obj = compile_program(TEMPLATE, options=options, cache=cache, name_expressions=("axpy<float>",), info=info)
    assert info.hit
    kernel = obj.get_kernel("axpy<float>")
    out = _run_axpy(dev, kernel)
    np.testing.assert_allclose(out, 2.0 * np.arange(1000, dtype=np.float32) + 1.0)


def test_ptx_from_a_hit_loads(tmp_path) -> None:
    from cuda.core import Device, ProgramOptions

    dev = Device(0)
    dev.set_current()
    cache = FileStreamProgramCache(tmp_path)
    options = ProgramOptions(arch=_arch(dev))
    compile_program(TEMPLATE, "c++", "ptx", options=options, cache=cache, name_expressions=("axpy<float>",))
    info = CompileInfo()
    obj = compile_program(
        TEMPLATE, "c++", "ptx", options=options, cache=cache, name_expressions=("axpy<float>",), info=info
    )
    assert info.hit and obj.code_type == "ptx"
    out = _run_axpy(dev, obj.get_kernel("axpy<float>"))
    np.testing.assert_allclose(out, 2.0 * np.arange(1000, dtype=np.float32) + 1.0)


def test_demo_on_gpu_passes_miss_then_hit(tmp_path) -> None:
    from kernelcache.cli.demo import DemoConfig, run_demo

    first = run_demo(DemoConfig(cache_dir=str(tmp_path), m=256, n=192, k=320, epilogue="gelu", tile_size=32))
    second = run_demo(DemoConfig(cache_dir=str(tmp_path), m=256, n=192, k=320, epilogue="gelu", tile_size=32))
    assert (first["cache_status"], second["cache_status"]) == ("MISS", "HIT")
    assert first["result"] == second["result"] == "PASSED"
