"""What compile_program returns and stores is what a plain cuda.core Program.compile of the same
request gives, byte for byte, on a miss and on a hit; and a compile's header set is whole
whatever the process compiled before (a failed compile, a traced compile of the caller's own).

Real NVRTC, real files, real processes: the headers are edited on disk and a fresh interpreter
must then compile what the edited headers say.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from cuda.core import Program, ProgramOptions
from helpers import ARCH, REPO, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

KERNELS = os.path.join(REPO, "benchmarks", "kernels")


def _plain(code: str, options: ProgramOptions, names: tuple[str, ...] = ()) -> bytes:
    program = Program(code, "c++", options=options)
    try:
        return bytes(program.compile("cubin", name_expressions=names).code)
    finally:
        program.close()


def test_a_miss_and_a_hit_are_a_plain_compiles_bytes(tmp_path, monkeypatch) -> None:
    # A CuPy kernel (cupyx.scipy.signal's symiirorder2, reduced to one user header) for which
    # NVRTC 13.5 generates other code when the compile carries -fdevice-time-trace.
    with open(os.path.join(KERNELS, "cupy", "reduced", "symiirorder2_fwd.cu")) as f:
        code = f.read()
    (tmp_path / "consts.h").write_text("#define M_PI 3.14159265358979323846\n")
    monkeypatch.chdir(tmp_path)
    settle_timestamps()
    names = ("compute_symiirorder2_fwd_sc<double>",)
    options = ProgramOptions(arch=ARCH)
    plain = _plain(code, options, names)
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        miss, hit = CompileInfo(), CompileInfo()
        first = compile_program(code, cache=cache, options=options, name_expressions=names, info=miss)
        second = compile_program(code, cache=cache, options=options, name_expressions=names, info=hit)
    assert (miss.hit, hit.hit) == (False, True)
    assert miss.headers == [str(tmp_path / "consts.h")]
    assert hashlib.sha256(bytes(first.code)).hexdigest() == hashlib.sha256(plain).hexdigest()
    assert bytes(second.code) == plain


_AFTER_A_FAILURE = r"""
import hashlib, os, sys, warnings
warnings.simplefilter("ignore")
from cuda.core import Program, ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
root, arch, how = sys.argv[1], sys.argv[2], sys.argv[3]
cache = FileStreamProgramCache(root)
bad = '#include "bad0.h"\nextern "C" __global__ void bad(int* o) {}\n'
# A traced compile before the failure, then the failure: NVRTC 13.5 then drops header events.
before = '#include "mid.h"\nextern "C" __global__ void before(int* o) { o[0] = TOP; }\n'
pres = ["pre.h", "pre2.h"]
if how == "kernelcache":
    compile_program(before, cache=cache, options=ProgramOptions(arch=arch, pre_include=pres))
    try:
        compile_program(bad, cache=cache, options=ProgramOptions(arch=arch))
    except Exception:
        pass
elif how == "own-trace":  # the caller's own traced compiles, outside kernelcache
    Program(before, "c++", options=ProgramOptions(arch=arch, pre_include=pres, fdevice_time_trace="own1")).compile("cubin")
    try:
        Program(bad, "c++", options=ProgramOptions(arch=arch, fdevice_time_trace="own2")).compile("cubin")
    except Exception:
        pass
out = []
for value in ("PRE", "MID", "NEST"):
    code = '#include "mid.h"\nextern "C" __global__ void k(int* o) { o[0] = %s; }\n' % value
    info = CompileInfo()
    obj = compile_program(code, cache=cache, options=ProgramOptions(arch=arch, pre_include=pres), info=info)
    out.append("%s:%s" % (info.hit, hashlib.sha256(bytes(obj.code)).hexdigest()))
print(" ".join(out))
"""


def _run(root: str, cwd: str, how: str, disable: bool = False) -> list[tuple[bool, str]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p)}
    if disable:
        env["KERNELCACHE_DISABLE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _AFTER_A_FAILURE, root, ARCH, how],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return [(part.split(":")[0] == "True", part.split(":")[1]) for part in proc.stdout.split()]


@pytest.mark.parametrize("how", ["kernelcache", "own-trace"])
@pytest.mark.parametrize("edited", ["pre.h", "mid.h", "nested.h"])
def test_headers_edited_after_a_failed_compile_miss_in_a_fresh_process(tmp_path, how: str, edited: str) -> None:
    # pre.h: a pre-include; mid.h: the source's first include; nested.h: two levels below it.
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "bad0.h").write_text('#include "no_such.h"\n')
    (proj / "pre.h").write_text("#define PRE 1\n")
    (proj / "pre2.h").write_text("#define PRE2 5\n")
    (proj / "mid.h").write_text('#include "top.h"\n#define MID 4\n')
    (proj / "top.h").write_text('#include "nested.h"\n#define TOP 3\n')
    (proj / "nested.h").write_text("#define NEST 2\n")
    root = str(tmp_path / "cache")
    settle_timestamps()
    first = _run(root, str(proj), how)
    assert [hit for hit, _ in first] == [False, False, False]
    old = (proj / edited).read_text()
    (proj / edited).write_text(old.replace("1", "100").replace("4", "400").replace("2", "200"))
    settle_timestamps()
    again = _run(root, str(proj), "none")
    truth = _run(root, str(proj), "none", disable=True)
    assert [digest for _, digest in again] == [digest for _, digest in truth]
