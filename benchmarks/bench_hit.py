"""The hit path, side by side with cuda.core in one run (issue 14 goals 4 and 5).

    PYTHONPATH=src python benchmarks/bench_hit.py                      # this tree vs cuda.core
    PYTHONPATH=src python benchmarks/bench_hit.py --against /tmp/old/src   # and an older tree

For each source tree (``src`` of this checkout, plus every ``--against`` one, e.g. a
``git archive <commit> src`` of an older commit) a fresh child process measures, on a cache
that one earlier child filled: (d) the first compile_program hit after imports, and (e) a
warm hit, the full call, with cuda.core's ``Program(...).compile("cubin",
cache=FileStreamProgramCache(dir))`` warm hit measured in the same child. Children of the
trees alternate, round after round, and every figure is the best of all rounds (a shared,
noisy machine only ever makes a run slower). Prints each figure and its ratio to cuda.core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

ARCH = os.environ.get("BENCH_ARCH", "sm_90")
# The demo's tiled matmul (no #include: no header manifest, as in bench_cold's (e)).
SOURCE = r"""
#define TILE 16
extern "C" __global__ void matmul(const float* a, const float* b, const float* bias, float* c, int n) {
    __shared__ float ta[TILE][TILE], tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        ta[threadIdx.y][threadIdx.x] = a[row * n + t + threadIdx.x];
        tb[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        __syncthreads();
    }
    float v = acc + bias[col];
    c[row * n + col] = v > 0.0f ? v : 0.0f;
}
"""


def best_us(fn: object, batches: int = 15, number: int = 100) -> float:
    """Best over ``batches`` of the mean time of ``number`` calls, in microseconds."""
    best = float("inf")
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(number):
            fn()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - t) / number)
    return best * 1e6


def child(root: str, fill: bool) -> None:
    """One measurement in this fresh process (PYTHONPATH picks the tree); a JSON line out."""
    t0 = time.perf_counter()
    from cuda.core import Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache as TheirFile

    from kernelcache import FileStreamProgramCache, compile_program

    opts = ProgramOptions(arch=ARCH)
    ours = FileStreamProgramCache(os.path.join(root, "ours"))
    theirs = TheirFile(os.path.join(root, "theirs"))
    imported = time.perf_counter()
    compile_program(SOURCE, options=opts, cache=ours)
    first = time.perf_counter() - imported
    if fill:
        Program(SOURCE, "c++", options=opts).compile("cubin", cache=theirs)
        print(json.dumps({}))
        return
    t = time.perf_counter()
    Program(SOURCE, "c++", options=opts).compile("cubin", cache=theirs)
    their_first = time.perf_counter() - t
    out = {
        "imports_ms": (imported - t0) * 1e3,
        "first_ms": first * 1e3,
        "their_first_ms": their_first * 1e3,
        "warm_us": best_us(lambda: compile_program(SOURCE, options=opts, cache=ours)),
        "their_warm_us": best_us(lambda: Program(SOURCE, "c++", options=opts).compile("cubin", cache=theirs)),
    }
    print(json.dumps(out))


def run_child(src: str, root: str, fill: bool = False) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([src, os.path.dirname(os.path.abspath(__file__))])
    args = [sys.executable, os.path.abspath(__file__), "--child", root] + (["--fill"] if fill else [])
    out = subprocess.run(args, env=env, check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", default=[], help="another tree's src/ directory to compare")
    parser.add_argument("--rounds", type=int, default=5, help="children per tree (alternating); best of them")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = [("this tree", here)] + [(f"--against {p}", os.path.abspath(p)) for p in args.against]
    work = tempfile.mkdtemp(prefix="kc-bench-hit-")
    best: dict[str, dict[str, float]] = {name: {} for name, _ in trees}
    try:
        roots = {}
        for name, src in trees:
            roots[name] = tempfile.mkdtemp(dir=work)
            run_child(src, roots[name], fill=True)  # the miss (and the bytecode caches)
        for r in range(args.rounds):
            for name, src in trees if r % 2 == 0 else reversed(trees):
                got = run_child(src, roots[name])
                for k, v in got.items():
                    best[name][k] = min(best[name].get(k, float("inf")), v)
            print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'tree':<40} {'measure':<34} {'kernelcache':>12} {'cuda.core':>12} {'ratio':>7}")
    for name, _ in trees:
        b = best[name]
        for label, ours, theirs, unit in (
            ("(e) warm hit, full call", b["warm_us"], b["their_warm_us"], "us"),
            ("(d) first hit after imports", b["first_ms"], b["their_first_ms"], "ms"),
        ):
            print(f"{name:<40} {label:<34} {ours:>10.2f}{unit} {theirs:>10.2f}{unit} {ours / theirs:>7.3f}")
        print(f"{name:<40} {'(d) imports (ours + cuda.core)':<34} {b['imports_ms']:>10.2f}ms")
    print(f"(python {sys.version.split()[0]}, arch {ARCH}, {os.cpu_count()} CPUs, best of {args.rounds} rounds)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], "--fill" in sys.argv)
    else:
        main()
