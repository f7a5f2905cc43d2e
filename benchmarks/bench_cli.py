"""What `kernelcache ls`, `ls --json`, `stats` and `verify` cost at 2,000 entries.

The budget (DECISIONS.md, "Drop-in"): `ls` and `stats` under 0.3 s at 2k entries. `verify`
re-hashes every artifact and has no budget; it is shown for scale.

The cache is real: one NVRTC compile through compile_program, its record (payload and
sidecar metadata) re-stored under 2,000 keys with set_record, as many kernels of one
project would be (arch, kernel names and compile time vary per entry). Each command runs
as a person runs it: the console script, a fresh process each time, bytecode caches
present, stdout a pipe (as in a script) and, with ``--tty``, a pseudo-terminal too. Best of
``--repeat`` runs: wall clock (the budget's measure) and CPU time (user + system), which a
machine busy with other work inflates less.

    PYTHONPATH=src python3 benchmarks/bench_cli.py [--entries 2000] [--kernel saxpy|cub] [--cache-dir DIR] [--tty]
"""

from __future__ import annotations

import argparse
import os
import pty
import resource
import shutil
import subprocess
import sys
import tempfile
import time

BUDGET_S = 0.3
_SOURCE = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


_CUB = r"""
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void block_sum(const float* in, float* out) {
    using BlockReduce = cub::BlockReduce<float, 256>;
    __shared__ typename BlockReduce::TempStorage tmp;
    float s = BlockReduce(tmp).Sum(in[blockIdx.x * 256 + threadIdx.x]);
    if (threadIdx.x == 0) out[blockIdx.x] = s;
}
"""


def build(root: str, entries: int, kernel: str = "saxpy") -> None:
    """A cache of ``entries`` entries at root, from one real compile re-stored under new keys.

    ``kernel="cub"``: a CUB block reduction, whose sidecar lists the hundreds of headers it
    includes (the largest metadata a typical entry carries)."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_program

    cache = FileStreamProgramCache(root)
    if kernel == "cub":
        compile_program(_CUB, options=ProgramOptions(arch="sm_90", std="c++17", use_bundled_headers=True), cache=cache)
    else:
        compile_program(_SOURCE, options=ProgramOptions(arch="sm_90", std="c++17"), cache=cache)
    record = next(e for e in cache.iter_entries() if (e.meta or {}).get("meta", {}).get("kind") != "manifest")
    with open(record.path, "rb") as f:
        payload = f.read()
    meta = dict(record.meta["meta"])
    have = sum(1 for e in cache.iter_entries())
    for i in range(entries - have):
        m = dict(meta)
        m["options"] = dict(meta.get("options") or {}, arch=("sm_80", "sm_90", "sm_100")[i % 3])
        m["kernels"] = [f"saxpy_{i}", f"tile<{i % 7}, float>"]
        m["compile_seconds"] = 0.05 + (i % 97) / 100
        cache.set_record(b"bench-cli-%d" % i, payload, m)
    cache.close()


def _command() -> list[str]:
    exe = shutil.which("kernelcache")
    return [exe] if exe else [sys.executable, "-m", "kernelcache"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _run_pipe(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU (user + system) is what a busy machine does not inflate."""
    c, t = _cpu(), time.perf_counter()
    subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t, _cpu() - c


def _run_tty(args: list[str]) -> tuple[float, float]:
    """The command with stdout on a pseudo-terminal, as on a screen."""
    master, slave = pty.openpty()
    c, t = _cpu(), time.perf_counter()
    proc = subprocess.Popen(args, stdout=slave, stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "100"})
    os.close(slave)
    while True:  # drain, or a full pty would block the child
        try:
            if not os.read(master, 1 << 16):
                break
        except OSError:
            break
    proc.wait()
    elapsed = time.perf_counter() - t, _cpu() - c
    os.close(master)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{args} exited {proc.returncode}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entries", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--cache-dir", default=None, help="reuse (and fill up to --entries) this cache")
    p.add_argument("--kernel", choices=["saxpy", "cub"], default="saxpy", help="the compile every entry copies")
    p.add_argument("--tty", action="store_true", help="also time ls/stats with stdout on a terminal")
    a = p.parse_args()
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as a person runs it: .pyc files written and used
    tmp = None
    root = a.cache_dir
    if root is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-cli-")
        root = tmp.name
    try:
        t = time.perf_counter()
        build(root, a.entries, a.kernel)
        print(f"cache: {root}, {a.entries} entries of {a.kernel} (built/filled in {time.perf_counter() - t:.1f} s)")
        base = _command()
        print(f"command: {' '.join(base)} <cmd> --cache-dir DIR, best of {a.repeat}, fresh process each")
        _run_pipe([*base, "--help"])  # bytecode caches written before timing
        cases = [("ls", False), ("ls --json", False), ("stats", False), ("stats --json", False), ("verify", False)]
        if a.tty:
            cases[3:3] = [("ls", True), ("stats", True)]
        print(f"{'command':<18}{'wall s':>8}{'cpu s':>8}{'budget':>8}{'ratio':>8}")
        for cmd, tty in cases:
            args = [*base, *cmd.split(), "--cache-dir", root]
            runs = [(_run_tty if tty else _run_pipe)(args) for _ in range(a.repeat)]
            best, cpu = min(w for w, _ in runs), min(c for _, c in runs)
            budgeted = cmd.split()[0] in ("ls", "stats")
            label = cmd + (" (tty)" if tty else "")
            ratio = f"{best / BUDGET_S:.2f}x" if budgeted else "-"
            print(f"{label:<18}{best:8.3f}{cpu:8.3f}{(f'{BUDGET_S:.1f}' if budgeted else '-'):>8}{ratio:>8}")
        runs = [_run_pipe([*base, "--version"]) for _ in range(a.repeat)]
        wall, cpu = min(w for w, _ in runs), min(c for _, c in runs)
        print(f"{'--version':<18}{wall:8.3f}{cpu:8.3f}{'-':>8}{'-':>8}   (start-up alone)")
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
