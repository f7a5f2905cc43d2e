"""kernelcache's stores vs cuda.core.utils' stores, side by side, same data, one process.

    python benchmarks/bench_stores.py            # full run (includes the 100k-entry case)
    python benchmarks/bench_stores.py --quick    # skip the 100k-entry case

Prints one table: each operation's median time for ours and theirs, and ours/theirs; while it
runs, one progress line per step on stderr (the full run takes several minutes, --quick about one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

from _timing import median_us
from cuda.core import ProgramOptions
from cuda.core.utils import FileStreamProgramCache as TheirFile
from cuda.core.utils import InMemoryProgramCache as TheirMemory
from cuda.core.utils import make_program_cache_key as their_key

from kernelcache import FileStreamProgramCache as OurFile
from kernelcache import InMemoryProgramCache as OurMemory
from kernelcache import make_program_cache_key as our_key

ARCH = "sm_90"
SRC = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] *= 2.0f; }\n' * 20
PAYLOAD = os.urandom(16 * 1024)  # a typical small cubin
ENTRY = 1024  # entry size for the capped-cache cases


def fill(cache: object, n: int, prefix: str) -> None:
    for i in range(n):
        cache[f"{prefix}{i}"] = os.urandom(ENTRY)  # type: ignore[index]


def capped_set_us(make: Callable[[str, int | None], object], n: int, work: str, writes: int) -> float:
    """Median time of one write into a capped cache that is full at n entries."""
    root = os.path.join(work, f"capped-{n}")
    fill(make(root, None), n, "fill")
    cache = make(root, None)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    cache = make(root, total)  # full: every further write must evict
    times = []
    for i in range(writes):
        t = time.perf_counter()
        cache[f"new{i}"] = os.urandom(ENTRY)  # type: ignore[index]
        times.append(time.perf_counter() - t)
    shutil.rmtree(root)
    return statistics.median(times) * 1e6


def open_capped_us(make: Callable[[str, int | None], object], n: int, work: str) -> float:
    root = os.path.join(work, f"open-{n}")
    fill(make(root, None), n, "fill")
    make(root, 10**12)  # first open (ours reconciles once; later opens do not rescan)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        make(root, 10**12)
        times.append(time.perf_counter() - t)
    shutil.rmtree(root)
    return statistics.median(times) * 1e6


# What a fresh process pays for its first hit: the same script for both libraries.
FIRST_HIT = """
import time; t0 = time.perf_counter()
from cuda.core import ProgramOptions
from {module} import FileStreamProgramCache, make_program_cache_key
t1 = time.perf_counter()
c = FileStreamProgramCache({root!r})
opts = ProgramOptions(arch="sm_90")
k = make_program_cache_key(code={src!r}, code_type="c++", options=opts, target_type="cubin")
assert c.get(k) is not None
t2 = time.perf_counter()
print(t2 - t0, t2 - t1)
"""
MODULES = {"ours": "kernelcache", "theirs": "cuda.core.utils"}


def first_hit_ms(which: str, work: str) -> tuple[float, float]:
    root = os.path.join(work, f"first-{which}")
    opts = ProgramOptions(arch=ARCH)
    if which == "ours":
        OurFile(root)[our_key(code=SRC, code_type="c++", options=opts, target_type="cubin")] = PAYLOAD
    else:
        TheirFile(root)[their_key(code=SRC, code_type="c++", options=opts, target_type="cubin")] = PAYLOAD
    code = FIRST_HIT.format(module=MODULES[which], root=root, src=SRC)
    # As installed software runs: with bytecode caches (some sandboxes set
    # PYTHONDONTWRITEBYTECODE, which would charge pure-Python modules a recompile per run).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, env=env)  # writes the caches
    samples = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        samples.append(tuple(float(x) for x in out.stdout.split()))
    total = statistics.median(s[0] for s in samples) * 1e3
    after_import = statistics.median(s[1] for s in samples) * 1e3
    return total, after_import


_START = time.monotonic()


def step(what: str) -> None:
    """One progress line on stderr, so a long run is never silent."""
    print(f"[{time.monotonic() - _START:6.1f} s] {what}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k-entry capped case")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    work = tempfile.mkdtemp(prefix="kc-bench-")
    rows: list[tuple[str, float, float, str]] = []
    try:
        step("key derivation, memory store")
        opts = ProgramOptions(arch=ARCH)
        kw = {"code": SRC, "code_type": "c++", "options": opts, "target_type": "cubin"}
        rows.append(("key derivation", median_us(lambda: our_key(**kw)), median_us(lambda: their_key(**kw)), "us"))

        om, tm = OurMemory(), TheirMemory()
        om[b"k"] = PAYLOAD
        tm[b"k"] = PAYLOAD
        rows.append(("memory get (hit)", median_us(lambda: om[b"k"]), median_us(lambda: tm[b"k"]), "us"))
        rows.append(
            (
                "memory set",
                median_us(lambda: om.__setitem__(b"k", PAYLOAD)),
                median_us(lambda: tm.__setitem__(b"k", PAYLOAD)),
                "us",
            )
        )

        step("file store: get, miss, set")
        of, tf = OurFile(os.path.join(work, "ours")), TheirFile(os.path.join(work, "theirs"))
        of[b"k"] = PAYLOAD
        tf[b"k"] = PAYLOAD
        rows.append(("file get (hit, 16 KiB)", median_us(lambda: of[b"k"]), median_us(lambda: tf[b"k"]), "us"))
        rows.append(("file get (miss)", median_us(lambda: of.get(b"nope")), median_us(lambda: tf.get(b"nope")), "us"))
        rows.append(
            (
                "file set (16 KiB)",
                median_us(lambda: of.__setitem__(b"k", PAYLOAD), number=50),
                median_us(lambda: tf.__setitem__(b"k", PAYLOAD), number=50),
                "us",
            )
        )
        sizes = [1_000, 10_000] + ([] if args.quick else [100_000])
        for n in sizes:
            step(f"set into a full capped cache of {n} entries (filling it first)")
            writes = 30 if n <= 10_000 else 5
            ours = capped_set_us(lambda r, c: OurFile(r, max_size_bytes=c), n, work, writes)
            theirs = capped_set_us(lambda r, c: TheirFile(r, max_size_bytes=c), n, work, writes)
            rows.append((f"set into full capped cache, {n // 1000}k entries", ours, theirs, "us"))
        step("open a capped cache of 10k entries")
        rows.append(
            (
                "open capped cache, 10k entries",
                open_capped_us(lambda r, c: OurFile(r, max_size_bytes=c), 10_000, work),
                open_capped_us(lambda r, c: TheirFile(r, max_size_bytes=c), 10_000, work),
                "us",
            )
        )
        step("fresh processes: imports + first hit (5 each)")
        o_total, o_after = first_hit_ms("ours", work)
        t_total, t_after = first_hit_ms("theirs", work)
        rows.append(("fresh process: imports + first hit", o_total, t_total, "ms"))
        rows.append(("fresh process: first hit after imports", o_after, t_after, "ms"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'operation':<44} {'kernelcache':>12} {'cuda.core':>12} {'ours/theirs':>12}")
    for name, ours, theirs, unit in rows:
        print(f"{name:<44} {ours:>10.1f}{unit} {theirs:>10.1f}{unit} {ours / theirs:>12.3f}")


if __name__ == "__main__":
    main()
