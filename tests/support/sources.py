"""Kernel sources and markers shared by the test folders (compile/, runners/, stores/, ...)."""

from __future__ import annotations

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH

TRIVIAL = 'extern "C" __global__ void fill(float* a, float v) { a[threadIdx.x] = v; }\n'
TEMPLATE = r"""
template <typename T>
__global__ void axpy(T a, const T* x, T* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
WARNS = TRIVIAL + '#pragma message("kernelcache test remark")\n'
HEAVY = r"""
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void block_sum(const float* in, float* out) {
    using BlockReduce = cub::BlockReduce<float, 256>;
    __shared__ typename BlockReduce::TempStorage tmp;
    float v = in[blockIdx.x * 256 + threadIdx.x];
    float s = BlockReduce(tmp).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
"""


def _bundled_headers_supported() -> bool:
    try:
        ProgramOptions(arch=ARCH, use_bundled_headers=True)
        return True
    except RuntimeError:  # cuda.core refuses it with an NVRTC that has no bundled headers
        return False


needs_bundled_headers = pytest.mark.skipif(
    not _bundled_headers_supported(), reason="this NVRTC has no bundled CUDA/CCCL headers"
)
