"""Wall time of ``kernelcache warm`` of a 100-kernel lockfile on a Dask LocalCluster of 1 and of 2
worker processes (one thread each, on 127.0.0.1), beside the local warm (-j 1 and -j N), in one run.

Each warm starts from an empty cache directory; the cluster is started before the clock starts
(a real cluster is there already) and each of its workers has made one compile (NVRTC loaded),
as a long-lived cluster's have; so has this process before the local warms. The lockfile is what
KERNELCACHE_RECORD writes: one line per kernel, each a few hundred lines of unrolled device code
(tens of ms of NVRTC each).
Prints each wall time and the ratios; runs here vary up to 2x (2 shared cores).

    PYTHONPATH=src python3 benchmarks/bench_warm_dask.py [--kernels 100] [--arch sm_90] [--repeat 1] [--workers 1,2]

The load average is printed with each figure: on a host other work shares, it says how far to trust it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

_BODY = """
extern "C" __global__ void k{i}(float* a, int n) {{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    float x = t < n ? a[t] : 0.0f;
    #pragma unroll
    for (int j = 0; j < {unroll}; ++j) x = x * {scale}f + __sinf(x + j);
    if (t < n) a[t] = x;
}}
"""


def write_lockfile(path: str, kernels: int, arch: str, unroll: int) -> None:
    """``kernels`` distinct kernels, as lockfile lines (recorded in this directory)."""
    with open(path, "w") as f:
        for i in range(kernels):
            code = _BODY.format(i=i, unroll=unroll, scale=1.0 + i / 1000)
            kernel = {"name": f"k{i}", "code": code, "code_type": "c++", "target": "cubin", "arch": arch}
            f.write(json.dumps({"kernel": [{**kernel, "options": {}, "cwd": os.getcwd()}]}) + "\n")


def timed_warm(lockfile: str, executor: object = None, jobs: int = 1) -> float:
    """Seconds of one warm of ``lockfile`` into a fresh cache directory (every kernel must warm)."""
    import kernelcache

    root = tempfile.mkdtemp(prefix="kc-bench-warm-")
    try:
        start = time.perf_counter()
        results = kernelcache.warm(lockfile, cache_dir=root, executor=executor, jobs=jobs)  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        failed = [r for r in results if r.get("error")]
        assert not failed, failed[:2]
        return seconds
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _first_compile() -> None:
    """One tiny compile in this process (NVRTC loaded and started), nothing stored."""
    from cuda.core import ProgramOptions

    from kernelcache.compile.request import CompileRequest
    from kernelcache.runners.compilers import run_compiler

    tiny = CompileRequest.of('extern "C" __global__ void w() {}', "c++", "cubin", ProgramOptions(arch="sm_90"), ())
    run_compiler(tiny, None)


def on_cluster(lockfile: str, workers: int, repeat: int, env: dict[str, str]) -> float:
    """Best of ``repeat`` warms on a LocalCluster of ``workers`` processes (started off the clock),
    their environment this one's plus ``env``."""
    from distributed import Client, LocalCluster

    kw = {"processes": True, "threads_per_worker": 1, "host": "127.0.0.1", "dashboard_address": None, "env": env}
    with (
        LocalCluster(n_workers=workers, **kw) as cluster,
        Client(cluster) as client,
    ):
        executor = client.get_executor(pure=False)
        client.run(_first_compile)  # each worker loads NVRTC once, as on a cluster that is up already
        return min(timed_warm(lockfile, executor) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--unroll", type=int, default=64, help="loop unroll per kernel (compile time)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", default="1,2", help="cluster sizes to time, comma-separated (the first: the base)")
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the cluster's workers (CUDA_VISIBLE_DEVICES= : workers that never initialise the driver)",
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.workers.split(",")]
    env = dict(item.split("=", 1) for item in args.worker_env)
    os.environ.setdefault("KERNELCACHE_RECORD", "")
    work = tempfile.mkdtemp(prefix="kc-bench-lock-")
    try:
        os.chdir(work)
        lockfile, warmup = os.path.join(work, "kernels.lock"), os.path.join(work, "warmup.lock")
        write_lockfile(lockfile, args.kernels, args.arch, args.unroll)
        write_lockfile(warmup, 1, args.arch, 1)
        timed_warm(warmup)  # this process's NVRTC loaded once, as for the cluster's workers
        cores = os.cpu_count() or 1
        local_1 = min(timed_warm(lockfile, jobs=1) for _ in range(args.repeat)), os.getloadavg()[0]
        local_n = min(timed_warm(lockfile, jobs=cores) for _ in range(args.repeat)), os.getloadavg()[0]
        on = {n: (on_cluster(lockfile, n, args.repeat, env), os.getloadavg()[0]) for n in sizes}
    finally:
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)
    shown = f", workers with {args.worker_env}" if env else ""
    print(f"{args.kernels} kernels ({args.arch}, unroll {args.unroll}), {cores} cores, best of {args.repeat}{shown}:")
    print(f"  local warm -j 1          {local_1[0]:7.2f} s   load {local_1[1]:.1f}")
    print(
        f"  local warm -j {cores:<3}        {local_n[0]:7.2f} s   load {local_n[1]:.1f}   (-j 1 / -j {cores}: "
        f"{local_1[0] / local_n[0]:.2f}x)"
    )
    base = sizes[0]
    for n, (seconds, load) in on.items():
        print(
            f"  dask, {n:>3} worker(s)      {seconds:7.2f} s   load {load:.1f}   ({base} / {n} workers: "
            f"{on[base][0] / seconds:.2f}x; / local -j 1: {seconds / local_1[0]:.2f})"
        )


if __name__ == "__main__":
    main()
