"""CuPy's NVRTC command line through kernelcache, on CPU (NVRTC needs no GPU): the bytes of
a compile are NVRTC's own for exactly that command line, in its order, and the key tells
two orders apart. What kernelcache.cupy compiles is argv_options(CuPy's flags)."""

from __future__ import annotations

import pytest
from helpers import ARCH

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program, make_program_cache_key
from kernelcache.compile.nvrtc_argv import argv_options
from kernelcache.compile.nvrtc_flags import program_options

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


INDEXED = (
    "import json, sys\n"
    "from kernelcache.integrations import cupy_index\n"
    "from kernelcache.stores.default import default_cache\n"
    "argv = tuple(json.loads(sys.argv[2]))\n"
    "store = default_cache()\n"
    "key = cupy_index.index_key(sys.argv[1], argv, 'cubin', None)\n"
    "if sys.argv[3] == 'compile':\n"
    "    from kernelcache import CompileInfo, compile_program\n"
    "    from kernelcache.compile.nvrtc_argv import argv_options\n"
    "    info = CompileInfo()\n"
    "    obj = compile_program(sys.argv[1], options=argv_options(argv), info=info)\n"
    "    cupy_index.remember(store, key, info.key)\n"
    "    print(json.dumps({'size': len(obj.code), 'hit': info.hit}))\n"
    "else:\n"
    "    found = cupy_index.find(store, key)\n"
    "    modules = sorted(m for m in sys.modules if m.startswith('cuda.core'))\n"
    "    print(json.dumps({'size': len(found[1]) if found else 0, 'cuda_core': modules,\n"
    "                      'hits': store.stats().get('hits', 0)}))\n"
)


def test_a_warm_cupy_hit_through_the_index_imports_no_cuda_core(tmp_path):
    # What a fresh process's first kernelcache.cupy hit costs over CuPy's own cache was
    # mostly cuda.core's import: the index hit reads two records and nothing else.
    import json

    from helpers import run_python

    env = {"KERNELCACHE_DIR": str(tmp_path / "kc")}
    argv = json.dumps([f"-arch={ARCH}", "-DFOO=3"])
    cold = json.loads(run_python(INDEXED, SOURCE, argv, "compile", env=env))
    warm = json.loads(run_python(INDEXED, SOURCE, argv, "find", env=env))
    assert cold["size"] == warm["size"] > 0 and not cold["hit"]
    assert warm["cuda_core"] == []
    assert warm["hits"] >= 1  # counted as a hit, like compile_program's
    other = json.dumps([f"-arch={ARCH}", "-DFOO=4"])  # other inputs: no index record, a miss
    assert json.loads(run_python(INDEXED, SOURCE, other, "find", env=env))["size"] == 0
