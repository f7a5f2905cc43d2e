"""The lighter install: what a compile really loads, and what the package asks pip for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ARCH, REPO

ROOT = REPO

CODE = f"""
from cuda.core import ProgramOptions
from kernelcache import compile_program
src = 'extern "C" __global__ void k(float* a) {{ a[0] = 1.0f; }}'
opts = ProgramOptions(arch={ARCH!r})
for target in ("cubin", "ptx", "ltoir"):
    compile_program(src, "c++", target, options=opts)
ptx = bytes(compile_program(src, "c++", "ptx", options=opts).code).decode()
compile_program(ptx, "ptx", "cubin", options=opts)                   # nvJitLink
import kernelcache.cli.main                                          # the command line too
with open("/proc/self/maps") as f:
    print("\\n".join(sorted({{line.split()[-1] for line in f if ".so" in line}})))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc (Linux)")
def test_cxx_and_ptx_compiles_load_neither_nvvm_nor_cufile(tmp_path) -> None:
    # Why the default install leaves out NVVM, cuFile and nvFatbin (the `nvvm` extra brings NVVM).
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300,
        env={**os.environ, "KERNELCACHE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    libs = proc.stdout.split()
    assert any("libnvrtc" in lib for lib in libs) and any("libnvJitLink" in lib for lib in libs), libs
    assert not [lib for lib in libs if "libnvvm" in lib or "libcufile" in lib or "libnvfatbin" in lib], libs


def test_the_package_asks_only_for_what_it_loads() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    deps = " ".join(project["dependencies"])
    assert "[cu13]" not in deps and "[all]" not in deps  # cuda-bindings[all]: NVVM, cuFile, nvFatbin
    assert "cuda-toolkit[nvrtc,nvjitlink]" in deps
    assert project["optional-dependencies"]["nvvm"] == ["cuda-toolkit[nvvm]==13.*"]
