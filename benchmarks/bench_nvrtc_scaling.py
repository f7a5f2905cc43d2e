"""Does NVRTC itself scale with threads, or only with processes, on this host? (issue 14, goal 2)

Raw NVRTC through cuda.bindings (no kernelcache, no cuda.core), K compiles of a small and a larger kernel:
a loop, W threads, W forked processes. On the H200 host (NVRTC 13.0, 16 CPUs) threads gave x4.8 for the
small kernel and processes x13.9: part of each compile is serialised inside one process, so compile_many's
threads cannot reach goal 2 for short compiles there.

Run: python3 benchmarks/bench_nvrtc_scaling.py [-K 64] [-W 16]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

SMALL = (
    'extern "C" __global__ void k%d(const float* A, const float* B, float* C, int n) {\n'
    "  __shared__ float a[16][16], b[16][16];\n"
    "  int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x;\n"
    "  float s = %d.0f;\n"
    "  for (int t = 0; t < n; t += 16) {\n"
    "    a[threadIdx.y][threadIdx.x] = A[r * n + t + threadIdx.x];\n"
    "    b[threadIdx.y][threadIdx.x] = B[(t + threadIdx.y) * n + c];\n"
    "    __syncthreads();\n"
    "    for (int k = 0; k < 16; k++) s += a[threadIdx.y][k] * b[k][threadIdx.x];\n"
    "    __syncthreads();\n"
    "  }\n"
    "  C[r * n + c] = s > 0 ? s : 0;\n"
    "}\n"
)
BIG = (
    'extern "C" __global__ void k%d(float* a) {\n'
    "  float s = %d;\n"
    "#pragma unroll\n"
    "  for (int j = 0; j < 512; j++) s = s * a[j] + __sinf(s);\n"
    "  a[threadIdx.x] = s;\n"
    "}\n"
)


def compile_one(arg: tuple[str, int]) -> bool:
    src, i = arg
    from cuda.bindings import nvrtc

    _, prog = nvrtc.nvrtcCreateProgram((src % (i, i)).encode(), b"x.cu", 0, [], [])
    result = nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
    nvrtc.nvrtcDestroyProgram(prog)
    return result[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS


def measure(name: str, src: str, k: int, w: int) -> None:
    compile_one((src, 10**6))  # load NVRTC and its builtins once
    start = time.perf_counter()
    ok = all(compile_one((src, i)) for i in range(k))
    loop = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(w) as ex:
        ok &= all(ex.map(compile_one, [(src, i + 1000) for i in range(k)]))
    threads = time.perf_counter() - start
    start = time.perf_counter()
    with ProcessPoolExecutor(w, mp_context=mp.get_context("fork")) as ex:
        ok &= all(ex.map(compile_one, [(src, i + 2000) for i in range(k)]))
    procs = time.perf_counter() - start
    print(
        f"{name}: K={k} one={loop / k * 1e3:.1f}ms loop {loop:.3f}s threads({w}) {threads:.3f}s "
        f"x{loop / threads:.2f}  fork-processes({w}) {procs:.3f}s x{loop / procs:.2f} ok={ok}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-K", "--kernels", type=int, default=64)
    parser.add_argument("-W", "--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = parser.parse_args()
    print("cpus", os.cpu_count(), "usable", len(os.sched_getaffinity(0)))
    measure("small", SMALL, args.kernels, args.workers)
    measure("big", BIG, args.kernels, args.workers)


if __name__ == "__main__":
    main()
