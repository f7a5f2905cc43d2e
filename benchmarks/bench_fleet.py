"""A fleet's first burst and one process's misses, compile_many's default vs cuda.core's loop, in one run.

    PYTHONPATH=src python benchmarks/bench_fleet.py                          # P=4 processes, K=16 variants
    PYTHONPATH=src python benchmarks/bench_fleet.py -P 8 -K 64 --hold-gpu    # the H200 host's figures
    PYTHONPATH=src python benchmarks/bench_fleet.py --against /tmp/old/src   # and an older tree's default

P fresh processes started together on one empty directory, each needing the same K variants of the
demo's kernel (then the same with one process): the wall time from their common start to the last
one's end (imports apart), the compiles (ours: the cache's count; cuda.core's: the misses its
processes found), and the compiler workers the processes started. Contenders alternate, medians of
``--reps``. ``--hold-gpu``: a process holds a CUDA context on device 0 for the whole run, as on a GPU
node where something runs; NVRTC's first compile in a process initialises the driver, which costs
several times more where nothing holds the GPU open (README, "Many kernels at once").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ARCH = os.environ.get("BENCH_ARCH", "sm_90")
_HOLD = "import time; from cuda.core import Device; Device(0).set_current(); print('held', flush=True); time.sleep(9e3)"


def child(mode: str, root: str, sources_file: str, start_at: float) -> None:
    """One process of a fleet (mode "theirs", "ours" or "against:<src>"): one JSON line."""
    if mode.startswith("against:"):
        sys.path.insert(0, mode.split(":", 1)[1])
    from cuda.core import Program, ProgramOptions

    if mode == "theirs":
        from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    else:
        from kernelcache import FileStreamProgramCache, compile_many
    with open(sources_file) as f:
        sources = json.load(f)
    opts = ProgramOptions(arch=ARCH)
    cache = FileStreamProgramCache(root)
    while time.time() < start_at:  # the processes of one fleet start together
        time.sleep(0.0005)
    compiles = workers = 0
    if mode == "theirs":
        for s in sources:
            key = make_program_cache_key(code=s, code_type="c++", options=opts, target_type="cubin")
            compiles += cache.get(key) is None
            Program(s, "c++", options=opts).compile("cubin", cache=cache)
    else:
        compile_many([{"code": s, "options": opts} for s in sources], cache=cache)
        from kernelcache.runners.pool import pool

        workers = pool().started
    print(json.dumps({"end": time.time(), "compiles": compiles, "workers": workers}))


def fleet(work: str, mode: str, sources_file: str, procs: int) -> tuple[float, int, int]:
    """(wall seconds, compiles, workers started) of ``procs`` processes started together."""
    root = tempfile.mkdtemp(dir=work)
    start_at = time.time() + 1.5 + 0.15 * procs  # after every interpreter imported cuda.core
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    args = [sys.executable, os.path.abspath(__file__), "--child", mode, root, sources_file, repr(start_at)]
    kids = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env) for _ in range(procs)]
    results = []
    for kid in kids:
        out, _ = kid.communicate(timeout=900)
        if kid.returncode != 0:
            raise RuntimeError(f"a {mode} process failed ({kid.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    if mode == "theirs":
        compiles = sum(r["compiles"] for r in results)
    else:
        from kernelcache import FileStreamProgramCache

        compiles = int(FileStreamProgramCache(root).stats()["compiles"])
    shutil.rmtree(root, ignore_errors=True)
    time.sleep(0.5)  # the workers of the last fleet end with their processes
    return max(r["end"] for r in results) - start_at, compiles, sum(r["workers"] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-P", "--procs", type=int, default=4, help="processes in the fleet")
    parser.add_argument("-K", "--kernels", type=int, default=16, help="variants each process needs")
    parser.add_argument("--reps", type=int, default=2, help="repetitions per median")
    parser.add_argument("--against", metavar="SRC", help="also the default of the kernelcache found in SRC")
    parser.add_argument("--hold-gpu", action="store_true", help="a process holds a CUDA context meanwhile")
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_cold import sample_source

    work = tempfile.mkdtemp(prefix="kc-bench-fleet-")
    os.environ["XDG_RUNTIME_DIR"] = os.path.join(work, "rt")  # this run's compile slots and batches
    os.mkdir(os.environ["XDG_RUNTIME_DIR"], 0o700)
    holder = None
    try:
        if args.hold_gpu:
            holder = subprocess.Popen([sys.executable, "-c", _HOLD], stdout=subprocess.PIPE, text=True)
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        sources = os.path.join(work, "variants.json")
        with open(sources, "w") as f:
            json.dump([sample_source(i) for i in range(args.kernels)], f)
        modes = {"theirs": "cuda.core's loop", "ours": "compile_many (default)"}
        if args.against:
            modes[f"against:{os.path.abspath(args.against)}"] = f"compile_many (default), {args.against}"
        for procs in dict.fromkeys((args.procs, 1)):
            got: dict[str, list[tuple[float, int, int]]] = {m: [] for m in modes}
            for _ in range(args.reps):
                for mode in modes:
                    got[mode].append(fleet(work, mode, sources, procs))
            theirs = statistics.median(r[0] for r in got["theirs"])
            print(f"{procs} process(es) x {args.kernels} kernels, one empty dir (medians of {args.reps}):")
            for mode, label in modes.items():
                wall = statistics.median(r[0] for r in got[mode])
                compiles, workers = [r[1] for r in got[mode]], [r[2] for r in got[mode]]
                print(f"  {label:<44} {wall:7.3f} s {wall / theirs:7.3f}x  compiles {compiles}  workers {workers}")
        print(f"(python {sys.version.split()[0]}, arch {ARCH}, {os.cpu_count()} CPUs, GPU held: {args.hold_gpu})")
    finally:
        if holder is not None:
            holder.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    else:
        main()
