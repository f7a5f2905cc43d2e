"""A real kernel compiled by NVRTC (no GPU needed) round-trips through both stores."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from cuda.core import ObjectCode, Program, ProgramOptions
from helpers import ARCH

from kernelcache import FileStreamProgramCache, InMemoryProgramCache, make_program_cache_key
from kernelcache.stores.file.store import FORMAT_DIR

SRC = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(scope="module")
def cubin() -> ObjectCode:
    return Program(SRC, "c++", options=ProgramOptions(arch=ARCH)).compile("cubin")


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_real_cubin_round_trip(tmp_path, cubin: ObjectCode, kind: str) -> None:
    store = InMemoryProgramCache() if kind == "memory" else FileStreamProgramCache(tmp_path)
    key = make_program_cache_key(code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin")
    store[key] = cubin
    data = store[key]
    assert data == bytes(cubin.code)
    assert data[:4] == b"\x7fELF"
    again = ObjectCode.from_cubin(data)
    assert bytes(again.code) == data


def test_file_entry_is_a_valid_elf_for_nvidia_tools(tmp_path, cubin: ObjectCode) -> None:
    store = FileStreamProgramCache(tmp_path)
    store[b"k"] = cubin
    (entry,) = [
        os.path.join(d, f)
        for d, _, fs in os.walk(tmp_path / FORMAT_DIR / "entries")
        for f in fs
        if not f.endswith(".meta")
    ]
    with open(entry, "rb") as f:
        assert f.read() == bytes(cubin.code)
    tool = shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump is not installed here; the byte-for-byte check above stands")
    out = subprocess.run([tool, "--dump-elf-symbols", entry], capture_output=True, text=True, check=True)
    assert "saxpy" in out.stdout
