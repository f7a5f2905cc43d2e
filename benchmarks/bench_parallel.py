"""Do compiles on threads run in parallel? One process, side by side, printing speedups and ratios.

    PYTHONPATH=src python benchmarks/bench_parallel.py            # K=16 variants, W=CPU count threads
    PYTHONPATH=src python benchmarks/bench_parallel.py -K 64      # the H200 host's figures

(1) each way of calling NVRTC, K compiles in a loop vs on W threads, and the longest time a
    Python thread spinning beside the loop was kept from running (near a whole compile's
    time: the call holds the GIL): cuda.core's Program.compile, kernelcache's direct
    cuda.bindings path (compilers.nvrtc_compile), and NVRTC through ctypes (no Python layer);
(2) K variants on empty caches: compile_many (in-memory store, file store) and our loop of
    compile_program vs cuda.core's loop of Program.compile(cache=FileStreamProgramCache).
Every figure is a median of --reps runs; every run compiles sources no earlier run compiled.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_cold import ARCH, sample_source  # noqa: E402

_serial = [0]


def fresh(k: int) -> list[str]:
    """K variants no earlier measurement compiled (NVRTC has no cache, but be sure)."""
    _serial[0] += k
    return [sample_source(_serial[0] + i) for i in range(k)]


def engines() -> dict[str, Callable[[str], object]]:
    from cuda.bindings import nvrtc
    from cuda.core import Program, ProgramOptions

    from kernelcache.runners.compilers import LogCollector, nvrtc_compile

    opts = ProgramOptions(arch=ARCH)
    nvrtc.nvrtcVersion()  # loads libnvrtc; ctypes then finds the same library by its soname
    lib = ctypes.CDLL(f"libnvrtc.so.{nvrtc.nvrtcVersion()[1]}")
    flag = (ctypes.c_char_p * 1)(f"-arch={ARCH}".encode())

    def core(src: str) -> object:
        program = Program(src, "c++", options=opts)
        try:
            return program.compile("cubin")
        finally:
            program.close()

    def direct(src: str) -> object:
        return nvrtc_compile(src, "cubin", opts, (), LogCollector())

    def raw(src: str) -> object:
        prog = ctypes.c_void_p()
        lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"p", 0, None, None)
        result = lib.nvrtcCompileProgram(prog, 1, flag)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        return result

    return {"cuda.core Program.compile": core, "kernelcache direct": direct, "NVRTC via ctypes": raw}


def loop_and_threads(fn: Callable[[str], object], k: int, workers: int) -> tuple[float, float, float]:
    """(loop seconds, threads seconds, longest stall of a spinning thread during the loop)."""
    stalls: list[float] = []
    stop = threading.Event()

    def spin() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            now = time.perf_counter()
            stalls.append(now - last)
            last = now

    spinner = threading.Thread(target=spin)
    spinner.start()
    t = time.perf_counter()
    for src in fresh(k):
        fn(src)
    loop = time.perf_counter() - t
    stop.set()
    spinner.join()
    sources = fresh(k)
    t = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(fn, sources))
    return loop, time.perf_counter() - t, max(stalls)


def batch_modes(k: int, workers: int, work: str) -> dict[str, Callable[[], object]]:
    from cuda.core import Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache as TheirFile

    from kernelcache import FileStreamProgramCache, compile_many, compile_program
    from kernelcache.stores.memory import InMemoryProgramCache

    opts = ProgramOptions(arch=ARCH)

    def requests() -> list[dict[str, object]]:
        return [{"code": s, "options": opts} for s in fresh(k)]

    def theirs() -> None:
        cache = TheirFile(tempfile.mkdtemp(dir=work))
        for src in fresh(k):
            Program(src, "c++", options=opts).compile("cubin", cache=cache)

    def our_loop() -> None:
        cache = FileStreamProgramCache(tempfile.mkdtemp(dir=work))
        for src in fresh(k):
            compile_program(src, options=opts, cache=cache)

    return {
        "cuda.core loop, Program.compile(cache=)": theirs,
        "our loop of compile_program, file store": our_loop,
        "compile_many, file store": lambda: compile_many(
            requests(), cache=FileStreamProgramCache(tempfile.mkdtemp(dir=work)), max_workers=workers
        ),
        "compile_many, in-memory store": lambda: compile_many(
            requests(), cache=InMemoryProgramCache(), max_workers=workers
        ),
    }


def environment() -> str:
    from cuda.bindings import nvrtc
    from cuda.core import __version__ as core_version

    from kernelcache.runners.compilers import driver_available

    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota = f.read().strip()
    except OSError:
        quota = "n/a"
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    major, minor = nvrtc.nvrtcVersion()[1:]
    return (
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs ({usable} usable, cgroup cpu.max {quota}), "
        f"NVRTC {major}.{minor}, cuda.core {core_version}, driver {'yes' if driver_available() else 'no'}, "
        f"load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-K", "--kernels", type=int, default=16, help="compiles per measurement")
    parser.add_argument("-W", "--workers", type=int, default=os.cpu_count() or 1, help="threads")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per median")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    k, workers, reps = args.kernels, args.workers, args.reps
    print(environment())
    found = engines()
    for fn in found.values():
        fn(sample_source(10**6))  # libraries loaded and warmed up
    print(f"(1) K={k} compiles: loop vs {workers} threads")
    for name, fn in found.items():
        runs = [loop_and_threads(fn, k, workers) for _ in range(reps)]
        loop, threads = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        stall = statistics.median(r[2] for r in runs)
        print(
            f"  {name:<28} loop {loop:7.3f}s  threads {threads:7.3f}s  speedup {loop / threads:5.2f}x"
            f"  one compile {loop / k * 1e3:6.1f} ms, longest GIL stall {stall * 1e3:6.1f} ms"
        )
    print(f"(2) K={k} variants on empty caches ({workers} workers), vs cuda.core's loop")
    with tempfile.TemporaryDirectory() as work:
        times: dict[str, list[float]] = {}
        modes = batch_modes(k, workers, work)
        for _ in range(reps):  # interleaved: a load change hits every mode alike
            for name, fn in modes.items():
                t = time.perf_counter()
                fn()
                times.setdefault(name, []).append(time.perf_counter() - t)
    ref = statistics.median(times["cuda.core loop, Program.compile(cache=)"])
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"  {name:<42} {median:7.3f}s  ratio {median / ref:5.2f}")


if __name__ == "__main__":
    main()
