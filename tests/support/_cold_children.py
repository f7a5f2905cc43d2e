"""Child processes for tests/runners: ``python _cold_children.py ROLE ARGS...`` prints one JSON line.

Each role runs in a fresh interpreter of its own: its compiler workers, its NVRTC, its environment.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

ARCH = "sm_90"
KERNEL = 'extern "C" __global__ void c{n}(float* a) {{ a[threadIdx.x] = a[threadIdx.x] * {n}.0f + 1.0f; }}\n'


def _many(root: str, numbers: range, processes: bool | None = True) -> list[object]:
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_many

    reqs = [{"code": KERNEL.format(n=n), "options": ProgramOptions(arch=ARCH)} for n in numbers]
    return compile_many(reqs, cache=FileStreamProgramCache(root), processes=processes)


def broken_start(root: str) -> dict[str, object]:
    """compile_many(processes=True) where a worker's interpreter cannot start (PYTHONHOME names
    no Python: it dies before its first line), the warnings recorded."""
    from kernelcache import FileStreamProgramCache

    os.environ["PYTHONHOME"] = os.path.join(root, "no-python-here")  # the workers' environment, not ours
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objs = _many(os.path.join(root, "c"), range(3))
    compiles = FileStreamProgramCache(os.path.join(root, "c")).stats()["compiles"]
    return {"compiled": len(objs), "compiles": compiles, "warnings": [str(w.message) for w in caught]}


def in_workers(root: str) -> dict[str, object]:
    """compile_many(processes=True) of two kernels, the warnings recorded (the workers end with us)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objs = _many(root, range(2))
    return {"compiled": len(objs), "warnings": [str(w.message) for w in caught]}


def fleet(root: str, gate: str, parties: str, count: str) -> dict[str, object]:
    """compile_many (its default choice) of ``count`` kernels on a shared store, started together
    with the other ``parties`` (startline.arrive at ``gate``)."""
    import hashlib

    warnings.simplefilter("ignore")
    from cuda.core import ProgramOptions  # noqa: F401 - imported before the start, as _many needs it
    from startline import arrive

    from kernelcache import FileStreamProgramCache, compile_many  # noqa: F401

    arrive(gate, int(parties))
    objs = _many(root, range(int(count)), processes=None)
    return {"digests": [hashlib.sha256(bytes(o.code)).hexdigest() for o in objs]}  # type: ignore[attr-defined]


def hold_idle_workers(root: str) -> dict[str, object]:
    """compile_many(processes=True) on every core of the node, its workers then left idle (for a
    minute, were nobody to wait for their slots); prints their pids, then reports which are alive
    once stdin closes."""
    from kernelcache.runners.pool import pool
    from kernelcache.runners.slots import usable_cores

    warnings.simplefilter("ignore")
    pool().idle_s = 60.0
    _many(root, range(usable_cores() * 2))
    pids = pool().pids()
    print(json.dumps({"pids": pids}), flush=True)
    sys.stdin.read()
    from helpers import running

    return {"alive": [p for p in pids if running(p)]}


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(240, exit=True)  # a hang ends the child (the test sees it)
    print(json.dumps(globals()[sys.argv[1]](*sys.argv[2:])), flush=True)
