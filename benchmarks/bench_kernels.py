"""KernelCache's L1 vs cuda.core's best in-process path, and per-device shard scaling.

    python benchmarks/bench_kernels.py

On a GPU: L1 hit latency of KernelCache.get_kernel vs cuda.core's
``Program.compile(cache=InMemoryProgramCache()).get_kernel(name)``, and lookups/s with
1, 2, 4, 8 threads, each thread on its own device shard (real kernels on the GPUs there are;
threads beyond the GPU count share devices). Without a GPU: the same scaling measured on
GuardedCache shards with stand-in values (what L1 is made of), and no cuda.core comparison.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from _timing import median_us

from kernelcache import GuardedCache

SRC = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }\n'


def threads_rate(lookup_for_thread: Callable[[int], Callable[[], object]], threads: int, seconds: float = 1.0) -> float:
    """Total look-ups per second with ``threads`` threads, each calling its own look-up."""
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def worker(i: int) -> None:
        fn = lookup_for_thread(i)
        start.wait()
        n = 0
        while not stop.is_set():
            for _ in range(200):
                fn()
            n += 200
        counts[i] = n

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def gpu_count() -> int:
    try:
        from cuda.core import Device, system

        Device(0).set_current()
        try:
            return int(system.get_num_devices())
        except Exception:
            return int(system.num_devices)
    except Exception:
        return 0


def main() -> None:
    n_gpus = gpu_count()
    print(f"python {sys.version.split()[0]}, GPUs: {n_gpus}")
    if n_gpus:
        from cuda.core import Device, Program, ProgramOptions
        from cuda.core.utils import InMemoryProgramCache as TheirMemory

        from kernelcache import InMemoryProgramCache, KernelCache

        dev = Device(0)
        dev.set_current()
        major, minor = dev.compute_capability
        opts = ProgramOptions(arch=f"sm_{major}{minor}")
        kc = KernelCache(InMemoryProgramCache())
        kc.get_kernel(SRC, "scale", options=opts, device=0)
        theirs = TheirMemory()
        Program(SRC, "c++", options=opts).compile("cubin", cache=theirs).get_kernel("scale")
        ours_explicit = median_us(lambda: kc.get_kernel(SRC, "scale", options=opts, device=0), number=2000)
        ours_current = median_us(lambda: kc.get_kernel(SRC, "scale", options=opts), number=2000)
        theirs_us = median_us(
            lambda: Program(SRC, "c++", options=opts).compile("cubin", cache=theirs).get_kernel("scale"), number=200
        )
        print(
            f"{'L1 hit (device=0)':<44} {ours_explicit:>9.2f} us   cuda.core {theirs_us:>9.2f} us   "
            f"ours/theirs {ours_explicit / theirs_us:.4f}"
        )
        print(f"{'L1 hit (current device)':<44} {ours_current:>9.2f} us   ours/theirs {ours_current / theirs_us:.4f}")
        for d in range(n_gpus):
            Device(d).set_current()
            major, minor = Device(d).compute_capability
            kc.get_kernel(SRC, "scale", options=ProgramOptions(arch=f"sm_{major}{minor}"), device=d)
        dev_opts = {
            d: ProgramOptions(arch=f"sm_{Device(d).compute_capability[0]}{Device(d).compute_capability[1]}")
            for d in range(n_gpus)
        }

        def real(i: int) -> Callable[[], object]:
            d = i % n_gpus
            o = dev_opts[d]
            return lambda: kc.get_kernel(SRC, "scale", options=o, device=d)

        base = None
        for t in (1, 2, 4, 8):
            rate = threads_rate(real, t)
            base = base or rate
            print(
                f"get_kernel, {t} thread(s) on {min(t, n_gpus)} device shard(s): {rate:>12,.0f} lookups/s "
                f"(x{rate / base:.2f} of 1 thread)"
            )

    shards = {d: GuardedCache(lambda v: None) for d in range(8)}
    for d, shard in shards.items():
        shard.find_or_build(("kernel", d), object, device_id=d)

    def fake(i: int) -> Callable[[], object]:
        shard = shards[i]
        key = ("kernel", i)
        return lambda: shard.find_or_build(key, object, device_id=i)

    one = median_us(fake(0), number=20000)
    print(f"GuardedCache hit (stand-in value): {one:.3f} us")
    base = None
    for t in (1, 2, 4, 8):
        rate = threads_rate(fake, t)
        base = base or rate
        print(f"GuardedCache, {t} thread(s) on {t} shard(s): {rate:>12,.0f} lookups/s (x{rate / base:.2f} of 1 thread)")


if __name__ == "__main__":
    main()
