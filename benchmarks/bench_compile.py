"""compile_program vs cuda.core's Program.compile(cache=FileStreamProgramCache), side by side.

    python benchmarks/bench_compile.py            # P=4 processes x K=8 heavy kernels
    python benchmarks/bench_compile.py --quick    # P=2 x K=2

(a) hit latency of a full call; (b) cold start with P processes x K distinct heavy kernels
sharing one cache directory: wall time and number of compiles; (c) hit latency with 5 tracked
headers vs none. Prints ours, theirs and ours/theirs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import warnings

from _timing import median_us

ARCH = os.environ.get("BENCH_ARCH", "sm_90")
TRIVIAL = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] *= 2.0f; }\n'
HEAVY = r"""
#include <cub/block/block_reduce.cuh>
#define VARIANT {variant}
extern "C" __global__ void block_sum_{variant}(const float* in, float* out) {{
    using BlockReduce = cub::BlockReduce<float, 256>;
    __shared__ typename BlockReduce::TempStorage tmp;
    float v = in[blockIdx.x * 256 + threadIdx.x] * VARIANT;
    float s = BlockReduce(tmp).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}}
"""


def heavy_options():
    from cuda.core import ProgramOptions

    return ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17")


def _ours_worker(root: str, kernels: list[int], start_at: float) -> None:
    from kernelcache import FileStreamProgramCache, compile_program

    cache = FileStreamProgramCache(root)
    while time.time() < start_at:
        time.sleep(0.001)
    for v in kernels:
        compile_program(HEAVY.format(variant=v), options=heavy_options(), cache=cache)
    cache.close()


def _theirs_worker(root: str, kernels: list[int], start_at: float, counter: str) -> None:
    from cuda.core import Program
    from cuda.core.utils import FileStreamProgramCache
    from cuda.core.utils import make_program_cache_key as their_key

    cache = FileStreamProgramCache(root)
    while time.time() < start_at:
        time.sleep(0.001)
    for v in kernels:
        code = HEAVY.format(variant=v)
        # cuda.core refuses use_bundled_headers? No: it keys it. Count compiles by checking
        # the cache first (Program.compile(cache=...) does the same look-up internally).
        key = their_key(code=code, code_type="c++", options=heavy_options(), target_type="cubin")
        if cache.get(key) is None:
            with open(counter, "a") as f:
                f.write("c\n")
        Program(code, "c++", options=heavy_options()).compile("cubin", cache=cache)


def cold_start(which: str, procs: int, kernels: int, work: str) -> tuple[float, int]:
    root = os.path.join(work, f"cold-{which}")
    counter = os.path.join(work, f"count-{which}")
    ctx = mp.get_context("spawn")
    start_at = time.time() + 3.0  # all processes start compiling together
    order = list(range(kernels))
    jobs = []
    for p in range(procs):
        mine = order[p:] + order[:p]  # each process walks the K kernels from another point
        if which == "ours":
            jobs.append(ctx.Process(target=_ours_worker, args=(root, mine, start_at)))
        else:
            jobs.append(ctx.Process(target=_theirs_worker, args=(root, mine, start_at, counter)))
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
        assert j.exitcode == 0, f"{which} worker failed"
    wall = time.time() - start_at
    if which == "ours":
        from kernelcache import FileStreamProgramCache

        compiles = int(FileStreamProgramCache(root).stats()["compiles"])
    else:
        with open(counter) as f:
            compiles = len(f.read().split())
    return wall, compiles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--kernels", type=int, default=8)
    args = parser.parse_args()
    procs, kernels = (2, 2) if args.quick else (args.procs, args.kernels)
    warnings.simplefilter("ignore")
    from cuda.core import Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache as TheirFile

    from kernelcache import FileStreamProgramCache, compile_program

    work = tempfile.mkdtemp(prefix="kc-bench-compile-")
    rows = []
    try:
        opts = ProgramOptions(arch=ARCH)
        ours = FileStreamProgramCache(os.path.join(work, "ours"))
        theirs = TheirFile(os.path.join(work, "theirs"))
        compile_program(TRIVIAL, options=opts, cache=ours)
        Program(TRIVIAL, "c++", options=opts).compile("cubin", cache=theirs)
        rows.append(
            (
                "(a) hit: full call, trivial kernel",
                median_us(lambda: compile_program(TRIVIAL, options=opts, cache=ours), number=100),
                median_us(lambda: Program(TRIVIAL, "c++", options=opts).compile("cubin", cache=theirs), number=100),
                "us",
            )
        )
        # (c) 5 tracked headers vs none (ours only: cuda.core cannot cache include_path)
        inc = os.path.join(work, "inc")
        os.makedirs(inc)
        for i in range(5):
            with open(os.path.join(inc, f"h{i}.h"), "w") as f:
                f.write(f"#pragma once\n#define H{i} {i}\n")
        with_headers = "".join(f'#include "h{i}.h"\n' for i in range(5)) + TRIVIAL
        hopts = ProgramOptions(arch=ARCH, include_path=[inc])
        compile_program(with_headers, options=hopts, cache=ours)
        none = median_us(lambda: compile_program(TRIVIAL, options=opts, cache=ours), number=100)
        five = median_us(lambda: compile_program(with_headers, options=hopts, cache=ours), number=100)
        rows.append(("(c) hit with 5 tracked headers vs none (ours)", five, none, "us"))

        o_wall, o_compiles = cold_start("ours", procs, kernels, work)
        t_wall, t_compiles = cold_start("theirs", procs, kernels, work)
        rows.append((f"(b) cold start P={procs} x K={kernels} heavy: wall", o_wall, t_wall, "s"))
        rows.append((f"(b) cold start P={procs} x K={kernels} heavy: compiles", o_compiles, t_compiles, ""))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'measure':<52} {'kernelcache':>12} {'cuda.core':>12} {'ours/theirs':>12}")
    for name, a, b, unit in rows:
        print(f"{name:<52} {a:>10.2f}{unit:<2} {b:>10.2f}{unit:<2} {a / b if b else float('nan'):>12.3f}")
    print(f"(python {sys.version.split()[0]}, arch {ARCH})")


if __name__ == "__main__":
    main()
