"""The key's toolchain is the library file that compiles (its name, size and ELF build id, read
without loading it), and the environment variables that change NVRTC's output are in the key:
real libraries, real compiles, real processes."""

from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys

from helpers import ARCH, run_python

from kernelcache import FileStreamProgramCache

GNU_BUILD_ID_NOTE = struct.pack("<III", 4, 20, 3) + b"GNU\0"  # namesz, descsz (SHA-1), NT_GNU_BUILD_ID


def build_id(path: str) -> str:
    """The GNU build id of an ELF file, found by its note's bytes (no ELF parser of ours)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        at = data.find(GNU_BUILD_ID_NOTE) + len(GNU_BUILD_ID_NOTE)
        return data[at : at + 20].hex()


LOADED = """
import json
from cuda.bindings import nvrtc
from cuda.core import ProgramOptions
from kernelcache import explain_program_cache_key
parts = explain_program_cache_key(code='x', code_type='c++', options=ProgramOptions(arch=%r), target_type='cubin')
before = [l.split()[-1] for l in open('/proc/self/maps') if 'libnvrtc.so' in l]
nvrtc.nvrtcVersion()  # now load it, as a compile does
after = sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libnvrtc.so' in l and 'builtins' not in l})
print(json.dumps({"compiler": parts["toolchain.compiler"], "before": before, "after": after}))
"""


def test_the_key_names_the_build_of_the_libnvrtc_file_that_then_compiles() -> None:
    got = json.loads(run_python(LOADED % ARCH).strip().splitlines()[-1])
    assert got["before"] == []  # the key was made without loading NVRTC
    (path,) = got["after"]
    name, size = os.path.basename(os.path.realpath(path)), os.stat(path).st_size
    assert got["compiler"] == f"{name};{size};{build_id(path)}"


KERNEL = 'extern "C" __global__ void e(const float* a, float* b) { b[threadIdx.x] = a[threadIdx.x] * 2.0f; }\n'
COMPILE = """
import hashlib, json, sys
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
info = CompileInfo()
obj = compile_program(sys.argv[2], options=ProgramOptions(arch=%r), cache=FileStreamProgramCache(sys.argv[1]), info=info)
print(json.dumps({"hit": info.hit, "sha": hashlib.sha256(bytes(obj.code)).hexdigest()}))
"""


def _compile(root: str, env: dict[str, str]) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k != "FINALIZER_USE_LEGACY_ELF_BUILDER"}
    out = subprocess.run(
        [sys.executable, "-c", COMPILE % ARCH, root, KERNEL], capture_output=True, text=True, env={**base, **env}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_processes_that_differ_in_finalizer_use_legacy_elf_builder_get_their_own_cubins(tmp_path) -> None:
    legacy = {"FINALIZER_USE_LEGACY_ELF_BUILDER": "1"}  # read by libnvrtc at each compile
    truth = {name: _compile(str(tmp_path / name), env) for name, env in (("plain", {}), ("legacy", legacy))}
    assert truth["plain"]["sha"] != truth["legacy"]["sha"]  # it does change the cubin
    shared = str(tmp_path / "shared")
    first = _compile(shared, legacy)
    then = _compile(shared, {})  # the same source and options in a process without the variable
    again = _compile(shared, legacy)
    assert (first["hit"], then["hit"], again["hit"]) == (False, False, True)
    assert then["sha"] == truth["plain"]["sha"] and again["sha"] == truth["legacy"]["sha"]
    assert FileStreamProgramCache(shared).stats()["compiles"] == 2


def test_kernelcache_config_names_the_file_and_identity_the_key_records() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kernelcache", "config", "--json"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {r["setting"]: r for r in json.loads(out.stdout)}
    explained = json.loads(run_python(LOADED % ARCH).strip().splitlines()[-1])
    path = explained["after"][0]
    assert rows["nvrtc library"]["value"] == f"{path} ({explained['compiler']})"
