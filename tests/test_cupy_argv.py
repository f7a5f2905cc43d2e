"""CuPy's NVRTC command line through kernelcache, on CPU (NVRTC needs no GPU): the bytes of
a compile are NVRTC's own for exactly that command line, in its order, and the key tells
two orders apart. What kernelcache.cupy compiles is argv_options(CuPy's flags)."""

from __future__ import annotations

import pytest
from conftest import ARCH

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program, make_program_cache_key
from kernelcache.integrations.nvrtc_argv import argv_options
from kernelcache.integrations.nvrtc_flags import program_options

SOURCE = r"""
extern "C" __global__ void k(float* o) {
#ifdef FOO
    o[0] = FOO;
#else
    o[0] = -1.0f;
#endif
    int unused_var;
}
"""


def _nvrtc(flags: tuple[str, ...]) -> tuple[int, bytes]:
    """NVRTC itself on ``flags``, one option per item as CuPy passes them: (result, cubin)."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"default_program", 0, [], [])
    try:
        result = nvrtc.nvrtcCompileProgram(prog, len(flags), [f.encode() for f in flags])[0]
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return int(result), b""
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return 0, bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize(
    "flags",
    [
        ("-UFOO", "-DFOO=7"),
        ("-DFOO=7", "-UFOO"),
        ("-DFOO=1", "-DFOO=2"),
        ("-ftz=false", "-ftz=true"),
        ("-diag-error=177", "-diag-suppress=177"),
    ],
)
def test_a_compile_is_nvrtcs_own_for_that_command_line_in_that_order(flags, tmp_path):
    argv = (f"-arch={ARCH}", *flags)
    result, expected = _nvrtc(argv)
    assert result == 0
    store = FileStreamProgramCache(tmp_path)
    cold = compile_program(SOURCE, options=argv_options(argv), cache=store)
    info = CompileInfo()
    warm = compile_program(SOURCE, options=argv_options(argv), cache=store, info=info)
    assert bytes(cold.code) == bytes(warm.code) == expected
    assert info.hit


def test_two_orders_of_the_same_flags_are_two_keys_and_two_results(tmp_path):
    one, other = (f"-arch={ARCH}", "-UFOO", "-DFOO=7"), (f"-arch={ARCH}", "-DFOO=7", "-UFOO")
    assert _nvrtc(one)[1] != _nvrtc(other)[1]  # NVRTC reads its command line in order

    def key(flags: tuple[str, ...]) -> bytes:
        return make_program_cache_key(code=SOURCE, code_type="c++", target_type="cubin", options=argv_options(flags))

    assert key(one) != key(other)
    store = FileStreamProgramCache(tmp_path)
    assert bytes(compile_program(SOURCE, options=argv_options(one), cache=store).code) == _nvrtc(one)[1]
    assert bytes(compile_program(SOURCE, options=argv_options(other), cache=store).code) == _nvrtc(other)[1]


def test_a_command_line_nvrtc_refuses_fails_the_compile_as_in_nvrtc(tmp_path):
    argv = (f"-arch={ARCH}", "-diag-suppress=177", "-diag-error=177")
    assert _nvrtc(argv)[0] != 0
    from cuda.core._utils.cuda_utils import NVRTCError

    with pytest.raises(NVRTCError, match="unused_var"):
        compile_program(SOURCE, options=argv_options(argv), cache=FileStreamProgramCache(tmp_path))
    assert len(FileStreamProgramCache(tmp_path)) == 0  # nothing stored for a failed compile


@pytest.mark.parametrize("flag", ["-ftz=yes", "-ftz=1", "-ftz=True", "-prec-div=1", "-prec-sqrt=on", "-fmad=on"])
def test_a_boolean_value_nvrtc_refuses_is_refused_naming_the_flag(flag):
    assert _nvrtc((f"-arch={ARCH}", flag))[0] != 0
    for translate in (argv_options, program_options):
        with pytest.raises(ValueError, match=flag.replace("=", "=").split("=")[0]):
            translate((f"-arch={ARCH}", flag))


def test_relocatable_flags_set_the_field_only_where_a_link_follows():
    assert argv_options((f"-arch={ARCH}", "-dc")).relocatable_device_code is True
    assert argv_options((f"-arch={ARCH}", "-rdc=true")).relocatable_device_code is True
    assert argv_options((f"-arch={ARCH}", "-rdc=false")).relocatable_device_code is False
    with pytest.raises(ValueError, match="relocatable"):
        program_options(("-rdc=true",))  # a plain translation has nobody to link it
