"""Child processes for test_restrict_fallback.py: ``python _restrict_children.py ROLE ARGS...``.

Each role runs in a fresh interpreter and prints one JSON line (kernels, the reader and the
fresh compile are _pool_children's).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

from _pool_children import ARCH, _ptx, fresh, kernel, reader


def writer_without_workers(root: str) -> dict[str, object]:
    """No compiler worker can start here: restrict=True compiles in this process (kernel 1),
    then kernels 2 and 4 without it; then a forked child, whose workers can start, compiles
    kernel 6 in a worker and kernel 8 in itself."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, KernelCacheWarning, compile_many, compile_program

    real_python = sys.executable
    sys.executable = os.path.join(root, "no-such-python")  # as in an embedded interpreter
    cache = FileStreamProgramCache(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restricted = _ptx(
            compile_program(kernel(1), "c++", "ptx", options=ProgramOptions(arch=ARCH, restrict=True), cache=cache)
        )
        clean = [
            _ptx(compile_program(kernel(n), "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=cache))
            for n in (2, 4)
        ]
    shown = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
    sys.executable = real_python
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: NVRTC's state (and so the leak) is a copy of the parent's
        os.close(read_end)
        try:
            with warnings.catch_warnings(record=True) as in_child:
                warnings.simplefilter("always")
                (in_worker,) = compile_many(
                    [{"code": kernel(6), "target_type": "ptx", "options": ProgramOptions(arch=ARCH)}],
                    cache=cache,
                    processes=True,
                )
                here = compile_program(kernel(8), "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=cache)
            out = {"worker": _ptx(in_worker), "here": _ptx(here), "warnings": [str(w.message) for w in in_child]}
            os.write(write_end, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        child = json.loads(f.read() or b"{}")
    os.waitpid(pid, 0)
    return {"restricted": restricted, "clean": clean, "warnings": shown, "child": child}


def read_back(root: str) -> dict[str, object]:
    """Kernels 2, 4, 6 (reader's) and 8 from the store."""
    from cuda.core import ProgramOptions

    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

    out = reader(root)
    info = CompileInfo()
    obj = compile_program(
        kernel(8), "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=FileStreamProgramCache(root), info=info
    )
    out["8"] = {"hit": info.hit, "ptx": _ptx(obj)}
    return out


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    role, args = sys.argv[1], sys.argv[2:]
    print(json.dumps({"fresh": fresh, "writer": writer_without_workers, "reader": read_back}[role](*args)), flush=True)
