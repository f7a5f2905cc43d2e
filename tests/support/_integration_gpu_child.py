"""One fresh user process: launch a Triton or CuPy kernel once, time it, check the result.

    python tests/support/_integration_gpu_child.py MODE      MODE: triton | cupy (through kernelcache)
                                                            triton-own | cupy-own (their own caches)
                                                            triton-cpu | triton-cpu-own: no GPU, only
                                                            triton.compile for sm_90 (cache path only)

The caches come from the environment (KERNELCACHE_DIR, TRITON_CACHE_MANAGER, TRITON_CACHE_DIR,
CUPY_CACHE_DIR). Prints one JSON line: first_launch_s (first call to a finished result,
compile or cache load included), correct, compiled (compiles this process ran) and, for
kernelcache modes, stores (entries this process wrote to kernelcache's store).
Used by tests/integrations/test_integrations_gpu.py and benchmarks/bench_integrations.py.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

N = 1 << 20
CUPY_SRC = r"""
template<typename T>
__global__ void axpy(const T* x, const T* y, T* out, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


def _store_counters() -> dict[str, int]:
    from kernelcache import default_cache

    stats = default_cache().stats()
    return {"stores": int(stats.get("stores", 0)), "compiles": int(stats.get("compiles", 0))}


def run_triton(through_kernelcache: bool) -> dict:
    import torch
    import triton
    import triton.language as tl
    from triton import knobs

    events: list[bool] = []
    knobs.compilation.listener = lambda **kw: events.append(bool(kw["cache_hit"]))

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, a * x + y, mask=mask)

    x = torch.arange(N, device="cuda", dtype=torch.float32)
    y = torch.ones(N, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    torch.cuda.synchronize()
    before = _store_counters() if through_kernelcache else {}
    start = time.perf_counter()
    axpy[(triton.cdiv(N, 1024),)](x, y, out, 2.0, N, BLOCK=1024)
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    expected = 2.0 * np.arange(N, dtype=np.float32) + 1.0
    result = {
        "first_launch_s": first,
        "correct": bool(np.array_equal(out.cpu().numpy(), expected)),
        "compiled": events.count(False),
        "cache_hits": events.count(True),
    }
    if through_kernelcache:
        from triton.runtime.cache import get_cache_manager

        result["manager"] = type(get_cache_manager("0" * 64)).__module__
        result["stores"] = _store_counters()["stores"] - before["stores"]
    return result


def run_triton_cpu() -> dict:
    """triton.compile for sm_90 without a GPU: what the cache layer costs on a hit."""
    from _triton_axpy import compile_sm90, listen
    from triton.runtime.cache import triton_key

    events = listen()
    triton_key()  # hashes Triton's own files once per process (about a second): not the cache's cost
    start = time.perf_counter()
    compile_sm90(256)
    return {"first_launch_s": time.perf_counter() - start, "correct": True, "compiled": events.count(False)}


def run_cupy(through_kernelcache: bool) -> dict:
    import cupy as cp

    RawModule = cp.RawModule
    if through_kernelcache:
        from kernelcache.cupy import RawModule

    x_host = np.arange(N, dtype=np.float64)
    x, y = cp.asarray(x_host), cp.asarray(np.ones(N))
    out = cp.empty(N, dtype=cp.float64)
    cp.cuda.Device().synchronize()
    before = _store_counters() if through_kernelcache else {}
    start = time.perf_counter()
    mod = RawModule(code=CUPY_SRC, options=("-std=c++17",), name_expressions=("axpy<float>", "axpy<double>"))
    kernel = mod.get_function("axpy<double>")
    kernel(((N + 255) // 256,), (256,), (x, y, out, cp.float64(2.0), cp.int32(N)))
    cp.cuda.Device().synchronize()
    first = time.perf_counter() - start
    result = {"first_launch_s": first, "correct": bool(np.array_equal(cp.asnumpy(out), 2.0 * x_host + 1.0))}
    if through_kernelcache:
        after = _store_counters()
        result["compiled"] = after["compiles"] - before["compiles"]
        result["stores"] = after["stores"] - before["stores"]
    return result


def main(mode: str) -> None:
    runs = {
        "triton": lambda: run_triton(True),
        "triton-own": lambda: run_triton(False),
        "cupy": lambda: run_cupy(True),
        "cupy-own": lambda: run_cupy(False),
        "triton-cpu": run_triton_cpu,
        "triton-cpu-own": run_triton_cpu,
    }
    print(json.dumps(runs[mode]()))


if __name__ == "__main__":
    main(sys.argv[1])
