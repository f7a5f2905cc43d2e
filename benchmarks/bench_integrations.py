"""First launch of a Triton and of a CuPy kernel in a fresh process: cold vs warm, through
kernelcache and through each tool's own cache, side by side.

    python benchmarks/bench_integrations.py [--repeat 3] [--only triton|cupy]
    python benchmarks/bench_integrations.py --cpu      # no GPU: triton.compile for sm_90 only

Each figure is the median over --repeat fresh processes of the time from the first call to
a finished result (compile or cache load included; interpreter and import time excluded).
Cold: empty caches. Warm: a second process on the caches the cold one filled. The ratios
compare kernelcache with the tool's own cache (below 1: kernelcache is faster). For Triton,
the disk each cache holds after a cold and a warm process of one kernel, counted as ``du``
counts it, each inode once (tests/support/_triton_disk_child.usage, the measure of
bench_triton_disk.py): inodes (files + directories), apparent bytes (``du -sb``), and of
those the files alone. One kernel's figures include each cache's own tree; bench_triton_disk.py
also prints what each further kernel adds.
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

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support")
CHILD = os.path.join(TESTS, "_integration_gpu_child.py")
sys.path.insert(0, TESTS)

from _triton_disk_child import usage  # noqa: E402


def _child(mode: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, CHILD, mode], env={**os.environ, **env}, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _env(mode: str, root: str) -> dict[str, str]:
    env = {
        "KERNELCACHE_DIR": os.path.join(root, "kc"),
        "TRITON_CACHE_DIR": os.path.join(root, "triton"),
        "CUPY_CACHE_DIR": os.path.join(root, "cupy"),
    }
    if mode in ("triton", "triton-cpu"):
        env["TRITON_CACHE_MANAGER"] = "kernelcache.triton:KernelCacheManager"
    return env


def measure(mode: str, repeat: int) -> tuple[float, float, bool]:
    cold, warm, correct = [], [], True
    for _ in range(repeat):
        root = tempfile.mkdtemp(prefix="kc-bench-")
        try:
            env = _env(mode, root)
            first, second = _child(mode, env), _child(mode, env)
            cold.append(first["first_launch_s"])
            warm.append(second["first_launch_s"])
            correct = correct and first["correct"] and second["correct"]
            if second.get("compiled"):
                raise SystemExit(f"{mode}: the warm process compiled {second['compiled']} kernel(s)")
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return statistics.median(cold), statistics.median(warm), correct


def _precompile_kernelcache() -> None:
    # An installed package has its .pyc files; a checkout run with PYTHONDONTWRITEBYTECODE=1
    # would compile kernelcache's sources in every fresh process (about 50 ms here) and
    # charge that to the warm figure. Write them once, as an install would.
    import compileall

    import kernelcache

    compileall.compile_dir(os.path.dirname(kernelcache.__file__), quiet=1)


def disk(mode: str) -> dict[str, int]:
    """What a cold and then a warm process of ``mode`` leave in the caches (all of them)."""
    root = tempfile.mkdtemp(prefix="kc-bench-")
    try:
        _child(mode, _env(mode, root))
        _child(mode, _env(mode, root))
        return usage(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=["triton", "cupy"], default=None)
    parser.add_argument("--cpu", action="store_true", help="no GPU: time triton.compile (sm_90) only")
    args = parser.parse_args()
    _precompile_kernelcache()
    print(f"{'mode':<28}{'cold ms':>10}{'warm ms':>10}{'cold/warm':>11}  correct")
    for tool in ("triton-cpu",) if args.cpu else ("triton", "cupy"):
        if args.only not in (None, tool) and f"{args.only}-cpu" != tool:
            continue
        figures = []
        for mode, label in ((tool, f"{tool} via kernelcache"), (f"{tool}-own", f"{tool} own cache")):
            cold, warm, correct = measure(mode, args.repeat)
            figures.append((cold, warm))
            print(f"{label:<28}{cold * 1e3:>10.1f}{warm * 1e3:>10.1f}{cold / warm:>10.1f}x  {correct}")
        (kc_cold, kc_warm), (own_cold, own_warm) = figures
        print(f"{tool + ' kernelcache/own':<28}{kc_cold / own_cold:>9.2f}x{kc_warm / own_warm:>9.2f}x")
        if tool.startswith("triton"):
            ours, theirs = disk(tool), disk(f"{tool}-own")
            for label, u in (("kernelcache", ours), ("own", theirs)):
                print(
                    f"  disk {label:<22}{u['inodes']:>4} inodes ({u['files']} files, {u['dirs']} dirs)"
                    f" {u['bytes']:>8} B ({u['file_bytes']} B in files)"
                )
            ratios = {k: ours[k] / theirs[k] for k in ("inodes", "files", "bytes", "file_bytes")}
            print(
                f"  disk kernelcache/own       {ratios['inodes']:.2f}x inodes ({ratios['files']:.2f}x files)"
                f" {ratios['bytes']:.2f}x bytes ({ratios['file_bytes']:.2f}x in files)"
            )


if __name__ == "__main__":
    main()
