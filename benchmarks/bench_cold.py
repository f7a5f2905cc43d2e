"""The cold path, kernelcache vs cuda.core side by side in one run (issue 14's goals).

    PYTHONPATH=src python benchmarks/bench_cold.py               # P=4 processes, K=16 variants
    PYTHONPATH=src python benchmarks/bench_cold.py -P 8 -K 64    # the H200 host's figures
    PYTHONPATH=src python benchmarks/bench_cold.py --only b -K 64  # compile_many's modes alone

(a) one miss, the demo's tiled matmul and a CUB kernel: compile_program on an empty cache,
    cuda.core's Program.compile(cache=FileStreamProgramCache) on an empty cache, and plain
    NVRTC (Program.compile, no cache);
(b) a fresh process needing K variants: our loop of compile_program, our compile_many (its
    default choice, processes=True: worker processes, processes=False: threads), cuda.core's
    loop of Program.compile(cache=...); time after imports (workers start inside it), and the
    CPU seconds spent, this process's compiler workers included;
(c) P processes each needing the same K variants, one cache dir, started together on a node
    where nothing of kernelcache runs (the fleet's first burst), default settings: wall and
    compiles (ours: compile_many, and our loop for reference; cuda.core: its loop), and what of
    kernelcache is left running once they exited (nothing, or the row says so);
(d) the first hit in a fresh process, after imports (imports themselves shown apart);
(e) a hit in a warm process, the full call (best of alternating batches of 100 calls).
Every other figure is a median of --reps runs; children run with bytecode caches as installed
software does (PYTHONDONTWRITEBYTECODE unset). Prints ours, cuda.core's and the ratio.
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
import warnings

ARCH = os.environ.get("BENCH_ARCH", "sm_90")
CUB = r"""
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void block_sum(const float* in, float* out) {
    using BlockReduce = cub::BlockReduce<float, 256>;
    __shared__ typename BlockReduce::TempStorage tmp;
    float v = in[blockIdx.x * 256 + threadIdx.x];
    float s = BlockReduce(tmp).Sum(v);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
"""


def sample_source(variant: int | None = None) -> str:
    """The demo's tiled matmul (`kernelcache demo`); a variant adds its own constant."""
    from kernelcache.cli.demo import EPILOGUES, TILE_SIZES, generate_source

    if variant is None:
        return generate_source(16, "relu")
    tile, epilogue = TILE_SIZES[variant % 3], list(EPILOGUES)[(variant // 3) % 3]
    src = generate_source(tile, epilogue)
    return src.replace("epilogue(acc + bias[col])", f"epilogue(acc + bias[col] + {variant}.0f)")


def options(cub: bool = False):  # noqa: ANN201 - cuda.core.ProgramOptions, imported late
    from cuda.core import ProgramOptions

    return ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17") if cub else ProgramOptions(arch=ARCH)


# -- children: one fresh interpreter per measurement ------------------------------------------


def child(mode: str, root: str, sources_file: str, start_at: float) -> None:
    """Run one measurement in this (fresh) process; print a JSON line. ``mode@SRC``: with the
    kernelcache found in SRC (an older tree, bench_fleet.py --against)."""
    mode, _, src = mode.partition("@")
    if src:
        sys.path.insert(0, src)
    t0 = time.perf_counter()
    from cuda.core import Program, ProgramOptions

    if mode.endswith("theirs"):
        from cuda.core.utils import FileStreamProgramCache, make_program_cache_key
    else:
        from kernelcache import FileStreamProgramCache, compile_many, compile_program
    with open(sources_file) as f:
        sources = json.load(f)
    opts = ProgramOptions(arch=ARCH)
    cache = FileStreamProgramCache(root)
    imported = time.perf_counter()
    while time.time() < start_at:  # processes of one fleet start together
        time.sleep(0.0005)
    began = time.perf_counter()
    cpu_began = sum(os.times()[:2])
    compiles = 0
    if mode.startswith("many-"):  # many-ours: the default choice; many-procs, many-threads: forced
        processes = {"many-procs": True, "many-threads": False}.get(mode)
        compile_many([{"code": s, "options": opts} for s in sources], cache=cache, processes=processes)
    elif mode in ("loop-ours", "first-ours"):
        for s in sources:
            compile_program(s, options=opts, cache=cache)
    else:  # cuda.core's loop: count its compiles by looking first, as Program.compile does
        for s in sources:
            if mode == "loop-theirs":
                key = make_program_cache_key(code=s, code_type="c++", options=opts, target_type="cubin")
                compiles += cache.get(key) is None
            Program(s, "c++", options=opts).compile("cubin", cache=cache)
    done = time.perf_counter()
    cpu = sum(os.times()[:2]) - cpu_began + workers_cpu(mode)
    out = {"imports": imported - t0, "work": done - began, "end": time.time(), "compiles": compiles, "cpu": cpu}
    out["workers"] = workers_started(mode)
    print(json.dumps(out))


def workers_cpu(mode: str) -> float:
    """CPU seconds of kernelcache's compiler workers, all started inside the measurement."""
    if mode.endswith("theirs"):
        return 0.0
    from kernelcache.runners.pool import pool

    total = 0
    for pid in pool().pids():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def workers_started(mode: str) -> int:
    """The compiler workers this process started (0 for cuda.core's modes)."""
    if mode.endswith("theirs"):
        return 0
    from kernelcache.runners.pool import pool

    return pool().started


def spawn(mode: str, root: str, sources_file: str, start_at: float = 0.0) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    args = [sys.executable, os.path.abspath(__file__), "--child", mode, root, sources_file, repr(start_at)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)


def collect(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


# -- the measurements --------------------------------------------------------------------------


def one_miss(work: str, code: str, cub: bool, reps: int) -> tuple[float, float, float]:
    """(ours, cuda.core's, plain NVRTC) seconds for one miss on an empty cache: medians."""
    from cuda.core import Program
    from cuda.core.utils import FileStreamProgramCache as TheirFile

    from kernelcache import FileStreamProgramCache, compile_program

    runs: dict[str, list[float]] = {"ours": [], "theirs": [], "plain": []}
    contenders = {
        "ours": lambda root: compile_program(
            code, options=options(cub), cache=FileStreamProgramCache(os.path.join(root, "ours"))
        ),
        "theirs": lambda root: Program(code, "c++", options=options(cub)).compile(
            "cubin", cache=TheirFile(os.path.join(root, "theirs"))
        ),
        "plain": lambda root: Program(code, "c++", options=options(cub)).compile("cubin"),
    }
    names = list(contenders)
    for rep in range(reps + 1):  # the first run warms the libraries up and is not counted
        root = tempfile.mkdtemp(dir=work)
        # The order turns each rep: a compile right after another one (or after the rmtree) is
        # not always the same contender's.
        for name in names[rep % 3 :] + names[: rep % 3]:
            t = time.perf_counter()
            contenders[name](root)
            runs[name].append(time.perf_counter() - t)
        shutil.rmtree(root, ignore_errors=True)
    return tuple(statistics.median(runs[name][1:]) for name in names)  # type: ignore[return-value]


def fresh_processes(work: str, modes: list[str], sources_file: str, reps: int) -> dict[str, tuple[float, float]]:
    """mode -> (wall, CPU) medians, the modes interleaved so that a burst of load on a shared
    machine hits every mode alike."""
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(reps):
        for m in modes:
            root = tempfile.mkdtemp(dir=work)
            runs[m].append(collect(spawn(m, root, sources_file)))
            shutil.rmtree(root, ignore_errors=True)
    return {
        m: (statistics.median(r["work"] for r in rs), statistics.median(r["cpu"] for r in rs)) for m, rs in runs.items()
    }


def fleet(work: str, mode: str, sources_file: str, procs: int) -> tuple[float, int, int, int]:
    """(wall seconds, compiles, kernelcache processes left 5 s after they exited, workers the
    processes started) for ``procs`` processes started together on one empty dir."""
    root = tempfile.mkdtemp(dir=work)
    start_at = time.time() + 3.0 + 0.3 * procs  # after every interpreter imported cuda.core
    children = [spawn(mode, root, sources_file, start_at) for _ in range(procs)]
    results = [collect(c) for c in children]
    wall = max(r["end"] for r in results) - start_at
    if mode.partition("@")[0].endswith("ours"):
        from kernelcache import FileStreamProgramCache

        compiles = int(FileStreamProgramCache(root).stats()["compiles"])
    else:
        compiles = int(sum(r["compiles"] for r in results))
    shutil.rmtree(root, ignore_errors=True)
    time.sleep(5)  # a worker ends with its process: at once, or when it sees its pipe hang up
    workers = sum(int(r["workers"]) for r in results)
    return wall, compiles, len(_left_running(os.environ["XDG_RUNTIME_DIR"])), workers


def _left_running(marker: str) -> list[int]:
    """Processes whose environment names this run's runtime directory (all of the fleet's had it)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker.encode() in f.read() and int(name) != os.getpid():
                    with open(f"/proc/{name}/stat") as st:
                        if st.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.append(int(name))
        except (OSError, ValueError):
            continue
    return found


def first_hit(work: str, which: str, sources_file: str, reps: int) -> tuple[float, float]:
    """(imports, first hit after imports) seconds in a fresh process: medians."""
    root = tempfile.mkdtemp(dir=work)
    mode = f"first-{which}"
    collect(spawn(mode, root, sources_file))  # the miss that stores it (and writes bytecode caches)
    samples = [collect(spawn(mode, root, sources_file)) for _ in range(reps)]
    shutil.rmtree(root, ignore_errors=True)
    return statistics.median(s["imports"] for s in samples), statistics.median(s["work"] for s in samples)


def warm_hit_us(work: str) -> tuple[float, float]:
    from _timing import median_us
    from cuda.core import Program
    from cuda.core.utils import FileStreamProgramCache as TheirFile

    from kernelcache import FileStreamProgramCache, compile_program

    code, opts = sample_source(), options()
    ours, theirs = FileStreamProgramCache(os.path.join(work, "hit-ours")), TheirFile(os.path.join(work, "hit-theirs"))
    compile_program(code, options=opts, cache=ours)
    Program(code, "c++", options=opts).compile("cubin", cache=theirs)
    ours_hit = lambda: compile_program(code, options=opts, cache=ours)  # noqa: E731
    theirs_hit = lambda: Program(code, "c++", options=opts).compile("cubin", cache=theirs)  # noqa: E731
    # Batches of the two alternate and the best of each counts: a burst of load on a shared
    # machine then slows a batch of either, never one side's whole measure.
    ours_us, theirs_us = [], []
    for _ in range(15):
        ours_us.append(median_us(ours_hit, repeat=1, number=100))
        theirs_us.append(median_us(theirs_hit, repeat=1, number=100))
    return min(ours_us), min(theirs_us)


def run_dir(prefix: str) -> str:
    """A fresh work directory for one benchmark run, with this run's own compile slots in it
    (XDG_RUNTIME_DIR, inherited by every child: also a mark on the processes the run started)."""
    work = tempfile.mkdtemp(prefix=prefix)
    os.environ["XDG_RUNTIME_DIR"] = os.path.join(work, "rt")
    os.mkdir(os.environ["XDG_RUNTIME_DIR"], 0o700)
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-P", "--procs", type=int, default=4, help="processes in the fleet (c)")
    parser.add_argument("-K", "--kernels", type=int, default=16, help="variants per process (b, c)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per median")
    parser.add_argument("--skip-cub", action="store_true", help="skip the CUB kernel in (a)")
    parser.add_argument("--only", default="abcde", help="the sections to run, e.g. --only b")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    P, K, reps = args.procs, args.kernels, args.reps
    work = run_dir("kc-bench-cold-")
    rows: list[tuple[str, float, float, float | None, str]] = []

    def row(name: str, ours: float, theirs: float, plain: float | None = None, unit: str = "ms") -> None:
        rows.append((name, ours, theirs, plain, unit))
        print(f"  measured: {name}", file=sys.stderr, flush=True)

    try:
        variants = os.path.join(work, "variants.json")
        with open(variants, "w") as f:
            json.dump([sample_source(i) for i in range(K)], f)
        single = os.path.join(work, "single.json")
        with open(single, "w") as f:
            json.dump([sample_source()], f)

        if "a" in args.only:
            o, t, p = one_miss(work, sample_source(), False, reps)
            row("(a) one miss, sample kernel", o * 1e3, t * 1e3, p * 1e3)
        if "a" in args.only and not args.skip_cub:
            o, t, p = one_miss(work, CUB, True, max(1, reps // 2))
            row("(a) one miss, CUB kernel", o * 1e3, t * 1e3, p * 1e3)
        if "b" in args.only:
            modes = ["loop-theirs", "loop-ours", "many-ours", "many-procs", "many-threads"]
            got = fresh_processes(work, modes, variants, reps)
            theirs, theirs_cpu = got["loop-theirs"]
            labels = {"loop-ours": "our loop", "many-ours": "compile_many (default)"}
            labels |= {"many-procs": "compile_many, processes=True", "many-threads": "compile_many, threads"}
            for m, label in labels.items():
                row(f"(b) fresh process, K={K}: {label}", got[m][0], theirs, unit="s")
            for m, label in labels.items():  # what the wall time is made of on a loaded machine
                row(f"(b) CPU seconds, K={K}: {label}", got[m][1], theirs_cpu, unit="s")
        if "c" in args.only:
            w_many, c_many, left_many, _ = fleet(work, "many-ours", variants, P)
            w_loop, c_loop, left_loop, _ = fleet(work, "loop-ours", variants, P)
            w_theirs, c_theirs, _, _ = fleet(work, "loop-theirs", variants, P)
            row(f"(c) P={P} x K={K}, one dir, first burst: wall, compile_many (default)", w_many, w_theirs, unit="s")
            row(f"(c) P={P} x K={K}, one dir, first burst: wall, our loop", w_loop, w_theirs, unit="s")
            row(f"(c) P={P} x K={K}, one dir: compiles, compile_many (default)", c_many, c_theirs, unit="")
            row(f"(c) P={P} x K={K}, one dir: compiles, our loop", c_loop, c_theirs, unit="")
            row(f"(c) P={P} x K={K}: kernelcache processes left running after", left_many + left_loop, 0, unit="")
        if "d" in args.only:
            oi, oh = first_hit(work, "ours", single, reps)
            ti, th = first_hit(work, "theirs", single, reps)
            row("(d) fresh process: first hit after imports", oh * 1e3, th * 1e3)
            row("(d) fresh process: the imports", oi * 1e3, ti * 1e3)
        if "e" in args.only:
            ours_us, theirs_us = warm_hit_us(work)
            row("(e) warm process: a hit, full call", ours_us, theirs_us, unit="us")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    w = max([52, *(len(r[0]) for r in rows)])
    print(f"{'measure':<{w}} {'kernelcache':>12} {'cuda.core':>12} {'plain NVRTC':>12} {'ours/cuda.core':>15}")
    for name, a, b, c, unit in rows:
        plain = f"{c:>10.2f}{unit:<2}" if c is not None else f"{'':>12}"
        ratio = a / b if b else float("nan")
        extra = f"  (ours/plain {a / c:.2f})" if c else ""
        print(f"{name:<{w}} {a:>10.2f}{unit:<2} {b:>10.2f}{unit:<2} {plain} {ratio:>15.3f}{extra}")
    print(f"(python {sys.version.split()[0]}, arch {ARCH}, {os.cpu_count()} CPUs, medians of {reps} runs)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    else:
        main()
