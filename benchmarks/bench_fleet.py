"""A fleet's first burst and one process's misses, compile_many's default vs cuda.core's loop, in one run.

    PYTHONPATH=src python benchmarks/bench_fleet.py                          # P=4 processes, K=16 variants
    PYTHONPATH=src python benchmarks/bench_fleet.py -P 8 -K 64 --hold-gpu    # the H200 host's figures
    PYTHONPATH=src python benchmarks/bench_fleet.py --against /tmp/old/src   # and an older tree's default

P fresh processes started together on one empty directory, each needing the same K variants of the
demo's kernel (then the same with one process): bench_cold.py's (c), with its children and its
counts. Printed: the wall time from their common start to the last one's end (imports apart), the
compiles (ours: the cache's count; cuda.core's: the misses its processes found), the compiler
workers the processes started, and the kernelcache processes left running 5 s after they exited.
Contenders alternate, medians of ``--reps``. ``--hold-gpu``: a process holds a CUDA context on
device 0 for the whole run, as on a GPU node where something runs; NVRTC's first compile in a
process initialises the driver, which costs several times more where nothing holds the GPU open
(README, "Many kernels at once").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

from bench_cold import ARCH, fleet, run_dir, sample_source

_HOLD = "import time; from cuda.core import Device; Device(0).set_current(); print('held', flush=True); time.sleep(9e3)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-P", "--procs", type=int, default=4, help="processes in the fleet")
    parser.add_argument("-K", "--kernels", type=int, default=16, help="variants each process needs")
    parser.add_argument("--reps", type=int, default=2, help="repetitions per median")
    parser.add_argument("--against", metavar="SRC", help="also the default of the kernelcache found in SRC")
    parser.add_argument("--hold-gpu", action="store_true", help="a process holds a CUDA context meanwhile")
    args = parser.parse_args()
    work = run_dir("kc-bench-fleet-")
    holder = None
    try:
        if args.hold_gpu:
            holder = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        sources = os.path.join(work, "variants.json")
        with open(sources, "w") as f:
            json.dump([sample_source(i) for i in range(args.kernels)], f)
        modes = {"loop-theirs": "cuda.core's loop", "many-ours": "compile_many (default)"}
        if args.against:
            modes[f"many-ours@{os.path.abspath(args.against)}"] = f"compile_many (default), {args.against}"
        for procs in dict.fromkeys((args.procs, 1)):
            got: dict[str, list[tuple[float, int, int, int]]] = {m: [] for m in modes}
            for _ in range(args.reps):
                for mode in modes:
                    got[mode].append(fleet(work, mode, sources, procs))
            theirs = statistics.median(r[0] for r in got["loop-theirs"])
            print(f"{procs} process(es) x {args.kernels} kernels, one empty dir (medians of {args.reps}):")
            for mode, label in modes.items():
                wall = statistics.median(r[0] for r in got[mode])
                compiles, left, workers = ([r[i] for r in got[mode]] for i in (1, 2, 3))
                print(
                    f"  {label:<44} {wall:7.3f} s {wall / theirs:7.3f}x  compiles {compiles}  workers {workers}"
                    f"  left running {left}"
                )
        print(f"(python {sys.version.split()[0]}, arch {ARCH}, {os.cpu_count()} CPUs, GPU held: {args.hold_gpu})")
    finally:
        if holder is not None:
            holder.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
