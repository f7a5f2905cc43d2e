"""Disk use of Triton kernels: kernelcache as Triton's cache manager vs Triton's own directory.

    python benchmarks/bench_triton_disk.py [--kernels 8] [--real] [--gpu]

For each TRITON_STORE_BINARY_ONLY setting (unset: Triton's default, which keeps every IR; 1; 0),
both managers get the same calls, in fresh processes: a cold process compiles kernels (the
group of stage files, its metadata JSON, put_group, then its launcher .so and cuda_utils.so as
runtime/build.py caches them) and a warm process loads them again. The disk is counted as
``du`` counts it, each inode once (tests/support/_triton_disk_child.usage): files + directories
(inodes), apparent bytes (``du -sb``; file_bytes: the files' alone) and allocated bytes
(``du -sB1``). "one kernel": the
whole tree after the first kernel (its own files and the tree's); "per kernel": what each of
the next kernels added (the tree's fixed files excluded). Ratios are kernelcache / Triton.

Default: the calls with a small kernel's file sizes (no compiler). ``--real``: real
triton.compile for sm_90 on CPU (launchers still as calls: no driver). ``--gpu``: also one
real kernel launched on the GPU (tests/support/_integration_gpu_child.py), both caches, cold then warm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support")
sys.path.insert(0, TESTS)

from _triton_disk_child import usage  # noqa: E402

CHILD = os.path.join(TESTS, "_triton_disk_child.py")
GPU_CHILD = os.path.join(TESTS, "_integration_gpu_child.py")
MANAGER = "kernelcache.triton:KernelCacheManager"
FIELDS = ("inodes", "files", "dirs", "bytes", "file_bytes", "blocks_bytes")


def env_for(root: str, ours: bool, binary_only: str | None) -> dict[str, str]:
    env = dict(os.environ, KERNELCACHE_DIR=os.path.join(root, "kc"), TRITON_CACHE_DIR=os.path.join(root, "triton"))
    env.pop("TRITON_CACHE_MANAGER", None)
    env.pop("TRITON_STORE_BINARY_ONLY", None)
    if ours:
        env["TRITON_CACHE_MANAGER"] = MANAGER
    if binary_only is not None:
        env["TRITON_STORE_BINARY_ONLY"] = binary_only
    return env


def run(env: dict[str, str], *args: str, child: str = CHILD) -> dict:
    out = subprocess.run([sys.executable, child, *args], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(ours: bool, binary_only: str | None, kernels: int, mode: str = "calls") -> tuple[dict, dict]:
    """(the tree after one kernel, what each further kernel added on average)."""
    root = tempfile.mkdtemp(prefix="kc-disk-")
    try:
        env = env_for(root, ours, binary_only)
        for first, count in ((0, 1), (1, kernels - 1)):
            cold, warm = run(env, mode, str(first), str(count)), run(env, mode, str(first), str(count))
            if (cold["compiled"], warm["compiled"], warm["hits"]) != (count, 0, count):
                raise SystemExit(f"unexpected compiles/hits: cold {cold}, warm {warm}")
            if first == 0:
                one = usage(root)
        every = usage(root)
        return one, {k: (every[k] - one[k]) / (kernels - 1) for k in FIELDS}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def gpu_one_kernel(ours: bool) -> dict:
    root = tempfile.mkdtemp(prefix="kc-disk-")
    try:
        env = env_for(root, ours, None)
        mode = "triton" if ours else "triton-own"
        run(env, mode, child=GPU_CHILD)
        run(env, mode, child=GPU_CHILD)
        return usage(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def show(label: str, ours: dict, theirs: dict) -> None:
    for who, u in (("kernelcache", ours), ("triton own", theirs)):
        cells = "".join(f"{u[k]:>13.1f}" if isinstance(u[k], float) else f"{u[k]:>13}" for k in FIELDS)
        print(f"{label:<32}{who:<13}{cells}")
    ratios = "".join(f"{ours[k] / theirs[k]:>12.2f}x" if theirs[k] else f"{'-':>13}" for k in FIELDS)
    print(f"{label:<32}{'ratio':<13}{ratios}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=8, help="kernels per run (at least 2)")
    parser.add_argument("--real", action="store_true", help="real triton.compile (sm_90, CPU) instead of the calls")
    parser.add_argument("--gpu", action="store_true", help="also one kernel launched on the GPU")
    args = parser.parse_args()
    if args.kernels < 2:
        parser.error("--kernels must be at least 2")
    mode = "compile" if args.real else "calls"
    print(f"{'':<45}" + "".join(f"{k:>13}" for k in FIELDS))
    for setting in (None, "1", "0"):
        name = "unset" if setting is None else setting
        (one_ours, per_ours), (one_own, per_own) = (
            measure(ours, setting, args.kernels, mode) for ours in (True, False)
        )
        show(f"BINARY_ONLY={name} one kernel", one_ours, one_own)
        show(f"BINARY_ONLY={name} per kernel", per_ours, per_own)
    if args.gpu:
        show("GPU one kernel (launched)", gpu_one_kernel(True), gpu_one_kernel(False))


if __name__ == "__main__":
    main()
