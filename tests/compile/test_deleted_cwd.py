"""A deleted working directory (common under batch schedulers) never fails a compile.

NVRTC compiles in a deleted directory as cuda.core does; the headers a C++ compile reads
from it cannot be tracked, so such a compile runs untraced, is returned and never stored,
with one warning. Real processes whose working directory is really gone (rmdir'd).
"""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ARCH

CHILD = r"""
import hashlib, json, os, sys, warnings
from cuda.core import Program, ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, KernelCacheWarning, compile_many, compile_program, probe

root, arch = sys.argv[1], sys.argv[2]
inc = os.path.join(root, "inc")
os.makedirs(inc)
with open(os.path.join(inc, "h.h"), "w") as f:
    f.write("#define V 3\n")
gone = os.path.join(root, "job")
os.mkdir(gone)
os.chdir(gone)
os.rmdir(gone)  # the scheduler cleaned the job directory up under the running job
cache = FileStreamProgramCache(os.path.join(root, "cache"))
tracked = '#include "h.h"\nextern "C" __global__ void k(float* a) { a[0] = V; }'
plain = 'extern "C" __global__ void p(float* a) { a[0] = 1; }'
opts = lambda: ProgramOptions(arch=arch, include_path=[inc])
digest = lambda obj: hashlib.sha256(bytes(obj.code)).hexdigest()
out = {"reference": digest(Program(tracked, "c++", options=opts()).compile("cubin")), "calls": []}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        info = CompileInfo()
        obj = compile_program(tracked, options=opts(), cache=cache, info=info)
        out["calls"].append({"digest": digest(obj), "hit": info.hit, "cached": info.cached})
    out["probe"] = probe(tracked, options=opts(), cache=cache).hit
    out["many"] = [digest(o) for o in compile_many([{"code": tracked, "options": opts()}] * 2, cache=cache)]
    info = CompileInfo()
    compile_program(plain, options=ProgramOptions(arch=arch), cache=cache, info=info)  # names no file
    out["plain_cached"] = info.cached
out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
out["entries"] = [((e.meta or {}).get("meta") or {}).get("kernels") or ((e.meta or {}).get("meta") or {}).get("kind") for e in cache.iter_entries()]
print(json.dumps(out))
"""


def test_a_deleted_working_directory_compiles_untracked_and_stores_nothing(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), ARCH], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["digest"] for c in out["calls"]] == [out["reference"]] * 2
    assert out["many"] == [out["reference"]] * 2
    assert not any(c["hit"] or c["cached"] for c in out["calls"]) and out["probe"] is False
    assert out["plain_cached"] is True  # a source that names no file needs no directory: stored
    # The plain kernel's entry; nothing of the tracked one, no manifest (the source index that
    # explains misses is written on any miss).
    assert sorted(map(str, out["entries"])) == ["['p']", "source-index"]
    gone = [w for w in out["warnings"] if "working directory" in w]
    assert len(gone) == 1 and "not stored" in gone[0], out["warnings"]
