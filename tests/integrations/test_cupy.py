"""kernelcache.cupy on CPU: CuPy's option tuples become the same ProgramOptions (and keys), a
templated kernel compiled with them is a hit in a fresh process with its symbol mapping, and
the package works without CuPy or Triton installed. Loading into CuPy needs a GPU: see
test_integrations_gpu.py."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, run_python

from kernelcache import make_program_cache_key
from kernelcache.compile.nvrtc_flags import program_options

TEMPLATED = r"""
template<typename T>
__global__ void scale(const T* x, T* y, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + T(N_OFFSET);
}
"""


def _key(options: ProgramOptions) -> bytes:
    return make_program_cache_key(
        code=TEMPLATED, code_type="c++", options=options, target_type="cubin", name_expressions=("scale<float>",), extra_digest=b"h"
    )


def test_flags_give_the_options_and_the_key_of_the_equivalent_program_options():
    flags = (
        "-I/opt/a",
        "-I",
        "/opt/b",
        "-DN_OFFSET=1",
        "--define-macro=FAST",
        "-std=c++17",
        "--use_fast_math",
        "-ftz=true",
        f"-arch={ARCH}",
        "--device-as-default-execution-space",
        "-maxrregcount=64",
        "-lineinfo",
    )
    expected = ProgramOptions(
        arch=ARCH,
        include_path=["/opt/a", "/opt/b"],
        define_macro=[("N_OFFSET", "1"), "FAST"],
        std="c++17",
        use_fast_math=True,
        ftz=True,
        device_as_default_execution_space=True,
        max_register_count=64,
        lineinfo=True,
    )
    got = program_options(flags)
    for field in ("arch", "include_path", "define_macro", "std", "use_fast_math", "ftz", "max_register_count"):
        assert getattr(got, field) == getattr(expected, field), field
    assert _key(got) == _key(expected)
    # Each flag matters: dropping one changes the key (nothing is silently ignored).
    assert _key(program_options(flags[:-1])) != _key(got)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--frobnicate",), "not one kernelcache can pass"),
        (("-rdc=true",), "relocatable device code"),
        (("-dc",), "relocatable device code"),
        (("-ftz=maybe",), "expected true or false"),
        (("-arch",), "needs a value"),
        ((42,), "must be str"),
        ("-std=c++17", r"sequence of str, not one str: use \('-std=c\+\+17',\)"),  # not read letter by letter
    ],
)
def test_flags_that_cannot_be_mapped_raise_naming_the_flag(flags, message):
    with pytest.raises((ValueError, TypeError), match=message):
        program_options(flags)


def test_templated_kernel_with_cupy_style_flags_hits_in_a_fresh_process(tmp_path):
    # The very compile kernelcache.cupy.RawModule runs (the flags CuPy adds included), minus
    # the device: NVRTC runs on CPU. The second process must load it with its mapping.
    code = (
        "import json, sys\n"
        "from kernelcache import CompileInfo, compile_program\n"
        "from kernelcache.compile.nvrtc_flags import program_options\n"
        "flags = ('-DN_OFFSET=2', '--std=c++17', '-ftz=true', sys.argv[1], '--device-as-default-execution-space')\n"
        "info = CompileInfo()\n"
        "obj = compile_program(sys.argv[2], 'c++', 'cubin', options=program_options(flags),\n"
        "                      name_expressions=('scale<float>', 'scale<double>'), info=info)\n"
        "m = {k if isinstance(k, str) else k.decode(): v.decode() for k, v in obj.symbol_mapping.items()}\n"
        "print(json.dumps({'hit': info.hit, 'mapping': m, 'size': len(obj.code)}))\n"
    )
    env = {"KERNELCACHE_DIR": str(tmp_path / "kc")}
    first = json.loads(run_python(code, f"-arch={ARCH}", TEMPLATED, env=env))
    second = json.loads(run_python(code, f"-arch={ARCH}", TEMPLATED, env=env))
    assert (first["hit"], second["hit"]) == (False, True)
    assert second["mapping"] == first["mapping"] == {"scale<float>": "_Z5scaleIfEvPKT_PS0_S0_i", "scale<double>": "_Z5scaleIdEvPKT_PS0_S0_i"}
    assert second["size"] == first["size"] > 0


def test_cupys_own_assembled_options_are_all_mapped_and_compile(tmp_path):
    core = pytest.importorskip("cupy._core.core")
    from kernelcache import FileStreamProgramCache, compile_program

    flags = core.assemble_cupy_compiler_options(("-DN_OFFSET=1",))
    options = program_options((*flags, "-ftz=true", f"-arch={ARCH}", "--device-as-default-execution-space"))
    assert options.std is not None and options.include_path
    obj = compile_program(
        TEMPLATED, "c++", "cubin", options=options, name_expressions=("scale<float>",), cache=FileStreamProgramCache(tmp_path)
    )
    assert obj.symbol_mapping["scale<float>"] == b"_Z5scaleIfEvPKT_PS0_S0_i"


_BLOCK = (
    "import sys\n"
    "class _Block:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('triton', 'cupy', 'cupy_backends'):\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"  # as when absent
    "sys.meta_path.insert(0, _Block())\n"
)


@pytest.mark.parametrize("extra", ["triton", "cupy"])
def test_package_works_without_the_extra_and_says_which_to_install(extra, tmp_path):
    code = _BLOCK + (
        "import kernelcache\n"
        "from kernelcache import FileStreamProgramCache\n"
        "from kernelcache.compile.nvrtc_flags import program_options\n"
        f"FileStreamProgramCache({str(tmp_path / 'kc')!r})['k'] = b'v'\n"
        "try:\n"
        f"    import kernelcache.{extra}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = run_python(code)
    assert f"pip install 'kernelcache[{extra}]'" in out


def test_cupy_classes_refuse_flags_they_cannot_vouch_for_at_construction():
    kcupy = pytest.importorskip("kernelcache.cupy")  # CuPy imports without a GPU
    module = kcupy.RawModule(code=TEMPLATED, options=("-std=c++17",), name_expressions=("scale<float>",))
    assert isinstance(module, kcupy.RawModule)
    assert (module.code, module.options, module.name_expressions) == (TEMPLATED, ("-std=c++17",), ("scale<float>",))
    kernel = kcupy.RawKernel(TEMPLATED, "scale", ("-DN_OFFSET=1",))
    assert (kernel.name, kernel.options) == ("scale", ("-DN_OFFSET=1",))
    assert kcupy.RawKernel(TEMPLATED, "scale", translate_cucomplex=True)._compiled.translate_cucomplex is True
    assert isinstance(kcupy.RawKernel(TEMPLATED, "scale", ("-rdc=true",)), kcupy.RawKernel)  # linked at compile
    with pytest.raises(ValueError, match="--bogus"):
        kcupy.RawModule(code=TEMPLATED, options=("--bogus",))
    with pytest.raises(ValueError, match="-ftz=yes"):
        kcupy.RawKernel(TEMPLATED, "scale", ("-ftz=yes",))  # NVRTC refuses it too
    for make in (lambda: kcupy.RawKernel(TEMPLATED, "scale", "-std=c++17"), lambda: kcupy.RawModule(code=TEMPLATED, options="-w")):
        with pytest.raises(TypeError, match="sequence of str, not one str"):  # CuPy's own raise TypeError too
            make()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda k: k.RawModule(code=TEMPLATED, backend="nvcc"), "backend='nvcc'"),
        (lambda k: k.RawModule(code=TEMPLATED, jitify=True), "jitify=True"),
        (lambda k: k.RawKernel(TEMPLATED, "scale", ("-std=c++17",), "nvcc"), "backend='nvcc'"),
        (lambda k: k.RawKernel(TEMPLATED, "scale", jitify=True), "jitify=True"),
        (lambda k: k.RawKernel(TEMPLATED, "scale", ("-DCUPY_USE_JITIFY",)), "jitify=True"),
    ],
)
def test_what_kernelcache_does_not_compile_is_cupys_own_object_with_one_warning(make, reason):
    kcupy = pytest.importorskip("kernelcache.cupy")
    import cupy

    from kernelcache import KernelCacheWarning

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        obj = make(kcupy)
    ours = [w for w in seen if issubclass(w.category, KernelCacheWarning)]
    assert len(ours) == 1 and reason in str(ours[0].message) and "not by kernelcache" in str(ours[0].message)
    assert type(obj) in (cupy.RawModule, cupy.RawKernel)  # CuPy's class itself: compiled and cached by CuPy
    assert obj.code == TEMPLATED


def test_a_failed_compile_raises_cupys_compile_exception_with_nvrtcs_log(tmp_path):
    pytest.importorskip("kernelcache.cupy")
    from cuda.core._utils.cuda_utils import NVRTCError
    from cupy.cuda.compiler import CompileException

    from kernelcache import FileStreamProgramCache, compile_program
    from kernelcache.compile.nvrtc_argv import argv_options
    from kernelcache.integrations import cupy_build

    argv = (f"-arch={ARCH}", "-DN_OFFSET=1")
    broken = 'extern "C" __global__ void k(float* x) { x[0] = undeclared_name; }\n'
    with pytest.raises(NVRTCError) as raised:
        compile_program(broken, options=argv_options(argv), cache=FileStreamProgramCache(tmp_path))
    exc = cupy_build.compile_exception(raised.value, broken, argv)
    assert isinstance(exc, CompileException)
    message = str(exc)
    assert 'identifier "undeclared_name" is undefined' in message
    assert not message.startswith("6:") and "NVRTC_ERROR" not in message  # NVRTC's log, as CuPy words it
    assert (exc.source, exc.options, exc.backend) == (broken, argv, "nvrtc")


def test_translate_cucomplex_rewrites_the_include_and_prepends_cupys_headers():
    pytest.importorskip("kernelcache.cupy")
    from cupy._core import core

    from kernelcache.integrations import cupy_build

    code = "#include <cuComplex.h>\n  #  include  < cuComplex.h >\n#include <cuComplex.hpp>\nint x;\n"
    out = cupy_build.source_for_nvrtc(code, True)
    header = "".join(f"#include <{n}>\n" for n in core._cupy_header_list if n != "cupy/cuComplex_bridge.h")
    bridge = "#include <cupy/cuComplex_bridge.h>  // translate_cucomplex\n"
    # CuPy's pattern: at the start of a line, spaces allowed anywhere, up to the ">"
    assert out == header + bridge * 2 + "#include <cuComplex.hpp>\nint x;\n"
    assert cupy_build.source_for_nvrtc(code, False) == code


def test_cupy_backend_hook_round_trips_between_processes(tmp_path):
    pytest.importorskip("cupy.cuda._compiler_cache")  # CuPy >= 14
    env = {"KERNELCACHE_DIR": str(tmp_path / "kc")}
    save = (
        "import kernelcache.cupy as k\n"
        "from cupy.cuda import compiler\n"
        "k.install_backend()\n"
        "assert isinstance(compiler._kernel_cache_backend, k.KernelCacheBackend)\n"
        "compiler._kernel_cache_backend.save('abc.cubin', b'\\x7fELF payload', 'src')\n"
    )
    load = (
        "import kernelcache.cupy as k\n"
        "b = k.KernelCacheBackend()\n"
        "print(b.load('abc.cubin'), b.load('other.cubin'))\n"
    )
    run_python(save, env=env)
    assert run_python(load, env=env).strip() == "b'\\x7fELF payload' None"


def test_cupy_backend_with_an_unusable_cache_dir_is_an_empty_cache(tmp_path):
    # A default cache that cannot be opened must not make CuPy's compiles fail: the backend
    # misses and drops writes, with one warning.
    pytest.importorskip("cupy.cuda._compiler_cache")  # CuPy >= 14
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    theirs = tmp_path / "theirs"  # owned by another user: the default cache refuses it
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "import kernelcache.cupy as k\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    k.install_backend()\n"
        "    from cupy.cuda import compiler\n"
        "    b = compiler._kernel_cache_backend\n"
        "    b.save('abc.cubin', b'payload', 'src')\n"
        "    print(b.load('abc.cubin'), sum(w.category.__name__ == 'KernelCacheWarning' for w in seen))\n"
    )
    assert run_python(code, env={"KERNELCACHE_DIR": str(theirs)}).strip() == "None 1"


def _nvrtc_accepts(flags: tuple[str, ...]) -> bool:
    """NVRTC's own verdict on a command line (the way CuPy passes it: one option per item)."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k(float* x) { x[0] = 1; }', b"k.cu", 0, [], [])
    try:
        result = nvrtc.nvrtcCompileProgram(prog, len(flags), [f.encode() for f in flags])[0]
        return result == nvrtc.nvrtcResult.NVRTC_SUCCESS
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.mark.parametrize(
    "flag", ["-dopt=on", "-dopt=off", "-dopt=true", "-diag-suppress=177,550", "--diag-warn=177,550"]
)
def test_a_flag_is_refused_exactly_when_nvrtc_refuses_it(flag, tmp_path):
    # Translating a flag NVRTC would reject into "some other option" compiles what nobody
    # asked for, silently; refusing a flag NVRTC takes breaks "the same arguments as CuPy".
    from kernelcache import FileStreamProgramCache, compile_program

    flags = (f"-arch={ARCH}", flag)
    try:
        options = program_options(flags)
    except ValueError:
        ours = False
    else:
        code = 'extern "C" __global__ void k(float* x) { x[0] = 1; }'
        ours = compile_program(code, options=options, cache=FileStreamProgramCache(tmp_path)).code is not None
    assert ours == _nvrtc_accepts(flags)


def test_a_hand_off_reaches_cupys_class_when_ours_replaced_it_on_the_cupy_module(monkeypatch):
    # CuPy's own test suite, run with kernelcache's classes, puts them on the cupy module:
    # the hand-off of nvcc/jitify must still build CuPy's object, not recurse into ours.
    kcupy = pytest.importorskip("kernelcache.cupy")
    import cupy

    own_kernel, own_module = cupy.RawKernel, cupy.RawModule
    monkeypatch.setattr(cupy, "RawKernel", kcupy.RawKernel)
    monkeypatch.setattr(cupy, "RawModule", kcupy.RawModule)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert type(cupy.RawKernel(TEMPLATED, "scale", backend="nvcc")) is own_kernel
        assert type(cupy.RawModule(code=TEMPLATED, jitify=True)) is own_module


def test_a_raw_module_pickles_by_its_arguments():
    # CuPy's RawModule pickles; ours held a lock (its per-device modules) and did not.
    kcupy = pytest.importorskip("kernelcache.cupy")
    import pickle

    module = kcupy.RawModule(
        code=TEMPLATED, options=("-DN_OFFSET=1",), name_expressions=("scale<float>",), enable_cooperative_groups=True
    )
    again = pickle.loads(pickle.dumps(module))
    assert type(again) is kcupy.RawModule
    assert (again.code, again.options, again.name_expressions) == (TEMPLATED, ("-DN_OFFSET=1",), ("scale<float>",))
    assert again.enable_cooperative_groups is True
