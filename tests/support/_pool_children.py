"""Child processes for test_workers.py: ``python _pool_children.py ROLE ARGS...`` prints one JSON line.

Each role runs in a fresh interpreter, so what one compile leaves behind in NVRTC (the
``--restrict`` leak) or in the worker pool is that process's alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings

ARCH = "sm_90"
# Two pointers the compiler must assume may alias: without --restrict the loads of ``a`` are
# plain ld.global; with it they become ld.global.nc (the read-only cache path).
ALIASING = 'extern "C" __global__ void k{n}(const float* a, float* b) {{ b[threadIdx.x] = a[threadIdx.x] * {n}.0f + a[threadIdx.x + 1]; }}\n'


def kernel(n: int) -> str:
    return ALIASING.format(n=n)


def _ptx(obj: object) -> str:
    return bytes(obj.code).decode("utf-8", "replace")  # type: ignore[attr-defined]


def writer(root: str, batch: str) -> dict[str, object]:
    """restrict=True compiles of kernel 1, then kernel 2 without it, into the store at ``root``."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, InMemoryProgramCache, compile_many, compile_program

    cache = FileStreamProgramCache(root)
    if batch == "many":  # a mixed batch in worker processes: the clean ones must stay clean
        reqs = [
            {
                "code": kernel(n),
                "target_type": "ptx",
                "options": ProgramOptions(arch=ARCH, restrict=True if n % 2 else None),
            }
            for n in (1, 2, 3, 4, 5, 6)
        ]
        objs = compile_many(reqs, cache=cache, processes=True, max_workers=2)
        restricted, clean = _ptx(objs[0]), [_ptx(o) for o in objs[1::2]]
    else:
        restricted = _ptx(
            compile_program(kernel(1), "c++", "ptx", options=ProgramOptions(arch=ARCH, restrict=True), cache=cache)
        )
        clean = [_ptx(compile_program(kernel(2), "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=cache))]
    # And this process's own compile afterwards, in this process, into an empty store: clean?
    after = _ptx(
        compile_program(kernel(2), "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=InMemoryProgramCache())
    )
    return {"restricted": restricted, "clean": clean, "after": after}


def reader(root: str) -> dict[str, object]:
    """Kernel 2 (and 4, 6) from the store: hits."""
    from cuda.core import ProgramOptions

    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

    cache = FileStreamProgramCache(root)
    out = {}
    for n in (2, 4, 6):
        info = CompileInfo()
        obj = compile_program(kernel(n), "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=cache, info=info)
        out[str(n)] = {"hit": info.hit, "ptx": _ptx(obj)}
    return out


def fresh(n: str) -> dict[str, object]:
    """Kernel n compiled by NVRTC alone (cuda.bindings, nothing of kernelcache) in a process
    that compiled nothing else; NVRTC's whole PTX buffer, terminating NUL included, as stored."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(kernel(int(n)).encode(), b"default_program", 0, [], [])
    assert nvrtc.nvrtcCompileProgram(prog, 1, [f"-arch={ARCH}".encode()])[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    size = nvrtc.nvrtcGetPTXSize(prog)[1]
    buf = bytearray(size)
    nvrtc.nvrtcGetPTX(prog, buf)
    nvrtc.nvrtcDestroyProgram(prog)
    return {"ptx": bytes(buf).decode()}


def pool_pids(root: str, seconds: str) -> dict[str, object]:
    """compile_many in workers, print the workers' pids, then stay alive ``seconds``."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_many
    from kernelcache.runners.pool import pool

    reqs = [{"code": kernel(n), "options": ProgramOptions(arch=ARCH)} for n in (1, 2)]
    compile_many(reqs, cache=FileStreamProgramCache(root), processes=True)
    print(json.dumps({"pids": pool().pids()}), flush=True)
    time.sleep(float(seconds))
    return {}


def no_interpreter(root: str) -> dict[str, object]:
    """compile_many(processes=True) where no worker can start (the interpreter path is gone)."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_many

    sys.executable = os.path.join(root, "no-such-python")
    reqs = [{"code": kernel(n), "options": ProgramOptions(arch=ARCH)} for n in (1, 2, 3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objs = compile_many(reqs, cache=FileStreamProgramCache(root), processes=True)
    digests = [hashlib.sha256(bytes(o.code)).hexdigest() for o in objs]
    return {"digests": digests, "warnings": [str(w.message) for w in caught]}


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)
    warnings.simplefilter("ignore")
    role, args = sys.argv[1], sys.argv[2:]
    print(json.dumps(globals()[role](*args)), flush=True)
