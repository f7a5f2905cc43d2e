"""One key, one form of the bytes, byte for byte what a fresh compile gives.

``split_compile`` is NVRTC's thread count, but NVRTC writes ``-split-compile N`` into the
cubin: it is in the key. C++ -> PTX keeps NVRTC's terminating NUL wherever it is compiled
(cuda.core's Program keeps it with a driver; without one kernelcache calls NVRTC itself),
in this process or in a worker.
"""

from __future__ import annotations

import pytest
from cuda.core import Program, ProgramOptions
from helpers import ARCH

from kernelcache import CompileInfo, FileStreamProgramCache, compile_many, compile_program, make_program_cache_key

SRC = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 2.0f * a[threadIdx.x]; }'


def _nvrtc_ptx(src: str) -> bytes:
    """NVRTC alone, as cuda.core's Program calls it: the whole PTX buffer NVRTC hands out."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"default_program", 0, [], [])
    assert nvrtc.nvrtcCompileProgram(prog, 1, [f"-arch={ARCH}".encode()])[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
    buf = bytearray(nvrtc.nvrtcGetPTXSize(prog)[1])
    nvrtc.nvrtcGetPTX(prog, buf)
    nvrtc.nvrtcDestroyProgram(prog)
    return bytes(buf)


def test_split_compile_is_in_the_key_and_a_hit_matches_a_fresh_compile(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    for split in (None, 2, 4, 2):
        options = ProgramOptions(arch=ARCH, split_compile=split)
        fresh = bytes(Program(SRC, "c++", options=ProgramOptions(arch=ARCH, split_compile=split)).compile("cubin").code)
        info = CompileInfo()
        ours = bytes(compile_program(SRC, options=options, cache=cache, info=info).code)
        assert ours == fresh, f"split_compile={split}: not the bytes a fresh compile gives"
    assert info.hit  # the second split_compile=2 call
    keys = {
        make_program_cache_key(
            code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH, split_compile=s), target_type="cubin"
        )
        for s in (None, 2, 4)
    }
    assert len(keys) == 3


def test_cxx_to_ptx_keeps_nvrtcs_terminating_nul_here_and_in_workers(tmp_path) -> None:
    expected = _nvrtc_ptx(SRC)
    assert expected.endswith(b"\x00")
    cache = FileStreamProgramCache(tmp_path)
    here = bytes(compile_program(SRC, "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=cache).code)
    assert here == expected
    other = SRC.replace("2.0f", "3.0f")
    (in_worker,) = compile_many(
        [{"code": other, "target_type": "ptx", "options": ProgramOptions(arch=ARCH)}], cache=cache, processes=True
    )
    assert bytes(in_worker.code) == _nvrtc_ptx(other)
    info = CompileInfo()
    hit = bytes(compile_program(SRC, "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=cache, info=info).code)
    assert info.hit and hit == expected


@pytest.mark.gpu
def test_cxx_to_ptx_is_cuda_cores_bytes_with_a_driver(tmp_path) -> None:
    fresh = bytes(Program(SRC, "c++", options=ProgramOptions(arch=ARCH)).compile("ptx").code)
    ours = bytes(
        compile_program(
            SRC, "c++", "ptx", options=ProgramOptions(arch=ARCH), cache=FileStreamProgramCache(tmp_path)
        ).code
    )
    assert ours == fresh == _nvrtc_ptx(SRC)
