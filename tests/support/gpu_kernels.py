"""A small kernel and its launch on a real GPU, shared by the GPU tests of several folders."""

from __future__ import annotations

import numpy as np

SRC = r"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""



def _scale_on(device_id: int, kernel, n: int = 512) -> np.ndarray:
    import ctypes

    from cuda.core import Device, LaunchConfig, LegacyPinnedMemoryResource, launch

    dev = Device(device_id)
    dev.set_current()
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
