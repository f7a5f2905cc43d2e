"""What a fresh process's first NVRTC compile costs, and why (what a compiler worker's start pays).

Raw NVRTC through cuda.bindings (no kernelcache), each case in a fresh process: the first and the second
compile of a small kernel (wall and system CPU time), whether the first compile loaded the CUDA driver
(libcuda in /proc/self/maps afterwards), and the same first compile after the process initialised the
driver itself (cuInit). On the H200 host (NVRTC 13.0, driver 580; measured with these same calls in
one-off probes, before this script gathered them): the first compile 196-320 ms, 184-239 ms of it system
time, and libcuda mapped after it; after cuInit (187-190 ms by itself) the first compile is 15 ms. So a
worker's start there is the driver's initialisation, which NVRTC does in any process that compiles.

Run: python3 benchmarks/bench_nvrtc_first.py [--runs 3] [--env NAME=VALUE ...]
(--env: the children run with these variables too, e.g. CUDA_VISIBLE_DEVICES= to see whether NVRTC's
first compile still initialises the driver where no device is visible: what a compiler worker would pay.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SOURCE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = %d.0f * x[threadIdx.x]; }'


def _driver_loaded() -> bool:
    with open("/proc/self/maps") as maps:
        return any("libcuda.so" in line for line in maps)


def child(init_driver: bool) -> None:
    import resource
    import time

    from cuda.bindings import nvrtc

    nvrtc.nvrtcVersion()  # libnvrtc loaded outside the timed part
    init_ms = None
    if init_driver:
        from cuda.bindings import driver

        start = time.perf_counter()
        try:
            driver.cuInit(0)
        except Exception as exc:  # no driver on this host: nothing to compare
            print(json.dumps({"no_driver": f"{type(exc).__name__}: {exc}"}))
            return
        init_ms = 1000 * (time.perf_counter() - start)
    loaded_before = _driver_loaded()

    def compile_once(variant: int) -> tuple[float, float]:
        _, prog = nvrtc.nvrtcCreateProgram((SOURCE % variant).encode(), b"k.cu", 0, [], [])
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        (result,) = nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise SystemExit(f"compile failed: {result}")
        return 1000 * wall, 1000 * (after.ru_stime - before.ru_stime)

    first, second = compile_once(1), compile_once(2)
    print(
        json.dumps(
            {
                "init_ms": init_ms,
                "first": first,
                "second": second,
                "driver_loaded_by_first": _driver_loaded() and not loaded_before,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the children (repeatable)")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    if extra:
        print(f"children's environment adds {extra}")
    print(
        f"{'case':28s} {'cuInit ms':>9s} {'1st ms':>7s} {'1st sys':>7s} {'2nd ms':>7s} {'2nd sys':>7s}  libcuda by 1st"
    )
    for init_driver in (False, True):
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(int(init_driver))],
                capture_output=True,
                text=True,
                env={**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **extra},
            )
            if out.returncode != 0:
                raise SystemExit(out.stderr[-2000:])
            r = json.loads(out.stdout.strip().splitlines()[-1])
            if "no_driver" in r:
                print(f"no CUDA driver here, nothing to initialise first ({r['no_driver'][:80]})")
                return
            case = "after cuInit in the process" if init_driver else "fresh process"
            init = f"{r['init_ms']:9.0f}" if r["init_ms"] is not None else f"{'-':>9s}"
            print(
                f"{case:28s} {init} {r['first'][0]:7.0f} {r['first'][1]:7.0f} {r['second'][0]:7.0f} "
                f"{r['second'][1]:7.0f}  {r['driver_loaded_by_first']}"
            )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2] == "1")
    else:
        main()
