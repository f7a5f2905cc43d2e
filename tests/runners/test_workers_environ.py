"""The caller's environment, as compiler workers receive it: changed by other threads of the
caller while compile_many starts workers and hands them compiles (real threads, real workers)."""

from __future__ import annotations

import os
import threading
import warnings

from cuda.core import ProgramOptions
from helpers import ARCH

from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.runners.pool import pool

KERNEL = 'extern "C" __global__ void v{n}(float* a) {{ a[threadIdx.x] *= {n}.75f; }}\n'


def test_variables_set_and_removed_by_another_thread_fail_no_compile_and_no_worker(tmp_path) -> None:
    stop = threading.Event()

    def toggle() -> None:  # as code running under mock.patch.dict(os.environ) in another thread
        while not stop.is_set():
            os.environ["KERNELCACHE_TEST_TOGGLED"] = "1"
            del os.environ["KERNELCACHE_TEST_TOGGLED"]

    toggler = threading.Thread(target=toggle)
    toggler.start()
    try:
        for round in range(6):
            pool().close()  # workers start during the batch, while the variable comes and goes
            reqs = [
                {"code": KERNEL.format(n=n), "options": ProgramOptions(arch=ARCH)}
                for n in range(round * 8, round * 8 + 8)
            ]
            compiled = pool().compiles
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                objs = compile_many(reqs, cache=FileStreamProgramCache(tmp_path), processes=True, max_workers=2)
            # Every compile ran in a worker (none fell back to this process, none failed),
            # and the pool still takes compiles.
            assert [str(w.message) for w in caught] == [] and len(objs) == len(reqs)
            assert pool().compiles - compiled == len(reqs) and not pool().unavailable
    finally:
        stop.set()
        toggler.join()
