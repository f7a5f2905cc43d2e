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


def writer_without_workers(root: str, context: str = "") -> dict[str, object]:
    """No compiler worker can start here: a restrict=True compile (kernel 1), then kernels 2
    and 4 without it, into the store at ``root`` (``context`` "gpu": with a CUDA context current)."""
    from cuda.core import Device, ProgramOptions

    from kernelcache import FileStreamProgramCache, KernelCacheWarning, compile_program

    if context == "gpu":
        Device(0).set_current()  # the process forked for the restrict=True compile holds a copy of it

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
    return {"restricted": restricted, "clean": clean, "warnings": shown}


if __name__ == "__main__":
    import faulthandler

    faulthandler.dump_traceback_later(120, exit=True)
    role, args = sys.argv[1], sys.argv[2:]
    print(json.dumps({"fresh": fresh, "writer": writer_without_workers, "reader": reader}[role](*args)), flush=True)
