"""Inodes, bytes and time of N Triton kernels: Triton's own cache, kernelcache's directory, one bundle.

    python benchmarks/bench_bundle.py [--kernels 10000] [--dir /dev/shm]

No GPU needed: one real Triton kernel is compiled for sm_90 (triton.compile) into Triton's own
cache, and its files (IRs, cubin, metadata, group file) are stored N times under N keys, as
Triton's cache manager would after N compiles: through Triton's FileCacheManager, and through
kernelcache's KernelCacheManager (entries + the copies Triton is handed). Then `kernelcache
bundle create` writes the kernelcache directory into one file, and a fresh process looks one
kernel's group up through KERNELCACHE_BUNDLES alone (empty disk cache). Prints one table and
the ratios. Run it on a tmpfs (the default, /dev/shm) unless you want your disk's fsync cost.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

LOOKUP = r"""
import json, os, sys, time
from kernelcache.triton import KernelCacheManager  # imports Triton (most of a fresh process's first call)
start = time.perf_counter()
group = KernelCacheManager(sys.argv[1]).get_group(sys.argv[2])
took = time.perf_counter() - start
from kernelcache import default_cache
tiers = default_cache().tiers
print(json.dumps({"found": group is not None and len(group), "seconds": took,
                  "served_by": [type(t).__name__ for t in tiers if t.stats().get("hits", 0)]}))
"""


def compile_one(triton_dir: str) -> dict[str, bytes]:
    """The files of one real Triton kernel (compiled for sm_90 without a GPU), by name."""
    env = {**os.environ, "TRITON_CACHE_DIR": triton_dir, "TRITON_DEFAULT_FP_FUSION": "1"}
    env.pop("TRITON_CACHE_MANAGER", None)
    child = os.path.join(os.path.dirname(__file__), "..", "tests", "support", "_integration_gpu_child.py")
    subprocess.run([sys.executable, child, "triton-cpu-own"], env=env, check=True, capture_output=True)
    (key,) = os.listdir(triton_dir)
    folder = os.path.join(triton_dir, key)
    return {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}


def store_many(files: dict[str, bytes], kernels: int, manager_cls: type) -> None:
    """Store the kernel's files under ``kernels`` keys, as Triton's cache manager does after a compile."""
    group_name = next(n for n in files if n.startswith("__grp__"))[len("__grp__") :]
    members = {n: d for n, d in files.items() if not n.startswith("__grp__")}
    for i in range(kernels):
        key = hashlib.sha256(b"kernel %d" % i).hexdigest()
        manager = manager_cls(key)
        paths = {name: manager.put(data, name) for name, data in members.items()}
        manager.put_group(group_name, paths)


def inodes(root: str) -> tuple[int, int]:
    """(files + directories under root, bytes of the files)."""
    count, size = 0, 0
    for folder, dirs, names in os.walk(root):
        count += len(dirs) + len(names)
        size += sum(os.lstat(os.path.join(folder, n)).st_size for n in names)
    return count, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, default=10_000)
    parser.add_argument("--dir", default="/dev/shm")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="kc-bench-bundle-", dir=args.dir)
    try:
        run(work, args.kernels)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: str, kernels: int) -> None:
    files = compile_one(os.path.join(work, "one"))
    group_name = next(n for n in files if n.startswith("__grp__"))[len("__grp__") :]
    os.environ["TRITON_CACHE_DIR"] = os.path.join(work, "triton")
    os.environ["KERNELCACHE_DIR"] = os.path.join(work, "kc")
    from triton.runtime.cache import FileCacheManager

    from kernelcache.triton import KernelCacheManager

    rows = []
    start = time.perf_counter()
    store_many(files, kernels, FileCacheManager)
    rows.append(("Triton's own cache", *inodes(os.environ["TRITON_CACHE_DIR"]), time.perf_counter() - start))
    start = time.perf_counter()
    store_many(files, kernels, KernelCacheManager)
    took = time.perf_counter() - start
    kc = os.environ["KERNELCACHE_DIR"]
    entries = inodes(os.path.join(kc, "v2"))
    copies = inodes(os.path.join(kc, "materialized"))
    rows.append(("kernelcache directory: entries", *entries, took))
    rows.append(("kernelcache directory: Triton's copies", *copies, 0.0))
    bundle = os.path.join(work, "triton.kcb")
    start = time.perf_counter()
    cli = [sys.executable, "-m", "kernelcache", "bundle", "create", bundle, "--cache-dir", kc, "--json"]
    report = json.loads(subprocess.run(cli, check=True, capture_output=True, text=True).stdout)
    rows.append(("bundle (kernelcache bundle create)", 1, os.path.getsize(bundle), time.perf_counter() - start))
    env = {**os.environ, "KERNELCACHE_DIR": os.path.join(work, "empty"), "KERNELCACHE_BUNDLES": bundle}
    key = hashlib.sha256(b"kernel %d" % (kernels // 2)).hexdigest()
    proc = subprocess.run([sys.executable, "-c", LOOKUP, key, group_name], env=env, capture_output=True, text=True)
    lookup = json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-500:]}

    print(f"{kernels} Triton kernels of {len(files)} files each ({sum(map(len, files.values()))} bytes), on {work}")
    print(f"{'':40} {'inodes':>9} {'bytes':>12} {'write s':>8}")
    for name, count, size, seconds in rows:
        print(f"{name:40} {count:>9} {size:>12} {seconds:>8.1f}")
    print(f"bundle: {report['entries']} records in 1 inode; the directory's entries take {entries[0]}")
    print(f"first group look-up of a fresh process, bundle only (after importing Triton): {lookup}")


if __name__ == "__main__":
    main()
