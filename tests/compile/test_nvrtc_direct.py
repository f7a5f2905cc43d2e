"""C++ compiles run on NVRTC through cuda.bindings (compilers.nvrtc_compile) so that threads
compile in parallel; what they produce must be what cuda.core's Program.compile produces.

Every case compiles twice with the real NVRTC, once each way, and compares the bytes, the
ObjectCode's kind, name and symbol mapping, the log, and for failures the error's type and
message.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from kernelcache.compile.request import CompileRequest
from kernelcache.runners.compilers import LogCollector, _nvrtc_check, _nvrtc_directly, nvrtc_compile, run_compiler

TEMPLATE = r"""
#include "scale.h"
template <typename T, int N>
__global__ void axpy(T a, const T* x, T* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = a * x[i] * SCALE * N + y[i];
}
extern "C" __global__ void plain(float* y) {
#ifdef EXTRA
    y[threadIdx.x] += EXTRA;
#endif
    int unused;  // a warning: the log is not empty
}
"""
NAMES = ("axpy<float, 2>", "axpy<double, 3>", b"axpy<int, 1>")


def _options(headers: str, **kw: Any) -> Any:
    from cuda.core import ProgramOptions

    return ProgramOptions(include_path=[headers], **{"arch": "sm_90", **kw})


@pytest.fixture()
def headers(tmp_path) -> str:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "scale.h").write_text("#define SCALE 3\n")
    return str(tmp_path / "inc")


def _by_cuda_core(code: str, target: str, options: Any, names: tuple = ()) -> tuple[Any, str]:
    from cuda.core import Program

    log = LogCollector()
    program = Program(code, "c++", options=options)
    try:
        return program.compile(target, name_expressions=names, logs=log), log.text()
    finally:
        program.close()


def _directly(code: str, target: str, options: Any, names: tuple = ()) -> tuple[Any, str]:
    log = LogCollector()
    return nvrtc_compile(code, target, options, names, log), log.text()


def _same(ours: tuple[Any, str], theirs: tuple[Any, str]) -> None:
    (obj, log), (ref, ref_log) = ours, theirs
    assert bytes(obj.code) == bytes(ref.code)
    assert (obj.code_type, obj.name, obj.symbol_mapping) == (ref.code_type, ref.name, ref.symbol_mapping)
    assert log == ref_log


CASES = [
    pytest.param({}, id="arch"),
    pytest.param({"arch": "sm_80", "std": "c++20"}, id="sm80-c++20"),
    pytest.param({"define_macro": [("EXTRA", "2.5f"), "OTHER"], "std": "c++17"}, id="define_macro"),
    pytest.param({"use_fast_math": True, "max_register_count": 32, "ftz": True, "fma": False}, id="math-regs"),
    pytest.param({"relocatable_device_code": True}, id="rdc"),
    pytest.param({"name": "my/prog.cu", "diag_suppress": 177, "ptxas_options": ["-O2"]}, id="name-diag-ptxas"),
    # No restrict=True here: NVRTC keeps --restrict on for the rest of the process once a compile
    # used it, so an in-process restrict compile would change every later test's cubins.
    pytest.param({"ofast_compile": "min", "extra_device_vectorization": True}, id="ofast"),
]


@pytest.mark.parametrize("kw", CASES)
@pytest.mark.parametrize("names", [(), NAMES], ids=["no-names", "templates"])
def test_cubin_is_cuda_cores(headers, kw, names) -> None:
    options = _options(headers, **kw)
    assert _nvrtc_directly("c++", "cubin", options)
    _same(_directly(TEMPLATE, "cubin", options, names), _by_cuda_core(TEMPLATE, "cubin", options, names))


@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({"link_time_optimization": True}, id="dlto"),
        pytest.param({"link_time_optimization": True, "relocatable_device_code": True}, id="dlto-rdc"),
        pytest.param({"link_time_optimization": True, "gen_opt_lto": True, "name": "lto"}, id="gen-opt-lto"),
        pytest.param({}, id="no-dlto"),  # NVRTC gives an empty LTO-IR, cuda.core too
    ],
)
def test_ltoir_is_cuda_cores(headers, kw) -> None:
    options = _options(headers, **kw)
    assert _nvrtc_directly("c++", "ltoir", options)
    _same(_directly(TEMPLATE, "ltoir", options, NAMES), _by_cuda_core(TEMPLATE, "ltoir", options, NAMES))


def test_a_trace_option_gives_the_same_cubin_and_the_headers_read(headers, tmp_path) -> None:
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    obj = _directly(TEMPLATE, "cubin", _options(headers, fdevice_time_trace=ours))
    ref = _by_cuda_core(TEMPLATE, "cubin", _options(headers, fdevice_time_trace=theirs))
    _same(obj, ref)
    for trace in (ours, theirs):
        path = trace + ".json" if os.path.exists(trace + ".json") else trace
        with open(path) as f:
            assert "scale.h" in f.read()


@pytest.mark.parametrize(
    ("code", "kw", "names"),
    [
        pytest.param('extern "C" __global__ void k() { nope(); }', {}, (), id="compile-error"),
        pytest.param(TEMPLATE, {"arch": "sm_1"}, (), id="bad-arch"),
        pytest.param(TEMPLATE, {"std": "c++99"}, (), id="bad-std"),
        pytest.param(TEMPLATE, {}, ("axpy<float, 2>", "nothere<3>"), id="bad-name-expression"),
        pytest.param(TEMPLATE, {"ptxas_options": "--bogus"}, (), id="ptxas-error"),
        pytest.param('#include "absent.h"\n', {}, (), id="missing-header"),
        pytest.param("\xff\xe9 bad; // \xe9", {"name": "n\xe9"}, (), id="non-ascii"),
    ],
)
def test_a_failure_raises_what_cuda_core_raises(headers, code, kw, names) -> None:
    from cuda.core._utils.cuda_utils import NVRTCError

    options = _options(headers, **kw)
    with pytest.raises(NVRTCError) as ours:
        _directly(code, "cubin", options, names)
    with pytest.raises(NVRTCError) as theirs:
        _by_cuda_core(code, "cubin", options, names)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_an_error_with_an_empty_log_leaves_the_interpreter_alone() -> None:
    # cuda.core's own check reads an empty log into b" " * 1, the interpreter's shared
    # one-byte bytes object, which NVRTC then overwrites with a NUL; ours must not.
    from cuda.bindings import nvrtc
    from cuda.core._utils.cuda_utils import NVRTCError

    err, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k() {}', b"p", 0, [], [])
    try:
        assert nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
        with pytest.raises(NVRTCError) as caught:
            _nvrtc_check(nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_INPUT, prog)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    assert str(caught.value) == "3: NVRTC_ERROR_INVALID_INPUT, compilation log:\n\n\x00"
    assert bytes([32]) == b"\x20" and b" ".hex() == "20"


@pytest.mark.parametrize(
    ("code_type", "target", "kw"),
    [
        ("c++", "cubin", {"debug": True}),  # cuda.core compiles under a temp file's name
        ("c++", "cubin", {"lineinfo": True}),
        ("c++", "cubin", {"create_pch": "x.pch"}),  # PCH status and heap retries
        ("c++", "ltoir", {"pch": True}),
        ("c++", "cubin", {"extra_sources": []}),  # cuda.core refuses it for C++
        ("nvvm", "ltoir", {}),
        ("ptx", "cubin", {}),
    ],
)
def test_what_cuda_core_does_more_for_stays_with_cuda_core(headers, code_type, target, kw) -> None:
    assert not _nvrtc_directly(code_type, target, _options(headers, **kw))


def test_debug_compiles_still_go_through_cuda_core(headers) -> None:
    # With debug and the default name cuda.core compiles a temp file holding the source (for
    # cuda-gdb); the cubin then carries that name, so it differs from a direct compile.
    obj, _, _ = run_compiler(CompileRequest.of(TEMPLATE, options=_options(headers, lineinfo=True)), None)
    direct, _ = _directly(TEMPLATE, "cubin", _options(headers, lineinfo=True))
    assert bytes(obj.code) != bytes(direct.code)
    assert b"default_program" not in bytes(obj.code)


def test_threads_compile_what_a_loop_compiles(headers) -> None:
    # Eight compiles at once on one process's NVRTC: each result is the one a lone compile gives.
    options = [_options(headers, define_macro=("EXTRA", f"{i}.0f")) for i in range(8)]
    alone = [run_compiler(CompileRequest.of(TEMPLATE, options=o, name_expressions=NAMES), None)[0] for o in options]
    results: list[Any] = [None] * 8

    def one(i: int) -> None:
        results[i] = run_compiler(CompileRequest.of(TEMPLATE, options=options[i], name_expressions=NAMES), None)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [bytes(r.code) for r in results] == [bytes(a.code) for a in alone]
    assert len({bytes(a.code) for a in alone}) == 8
    assert all(r.symbol_mapping == alone[0].symbol_mapping for r in results)


def test_failed_traced_compiles_on_threads_leave_no_stray_trace(tmp_path, headers, monkeypatch) -> None:
    # NVRTC's trace state after a failed traced compile is per thread: the reset runs on the
    # thread that failed before it compiles again, while other threads compile untraced.
    from kernelcache import CompileManyError, FileStreamProgramCache, compile_many

    monkeypatch.chdir(tmp_path)
    bad = {"code": '#include "scale.h"\nextern "C" __global__ void k() { nope(SCALE); }'}
    good = [{"code": f'extern "C" __global__ void k(float* a) {{ a[0] = {i}; }}'} for i in range(12)]
    requests = [dict(r, options=_options(headers)) for r in [bad, *good[:6], bad, *good[6:]]]
    with pytest.raises(CompileManyError) as caught:
        compile_many(requests, cache=FileStreamProgramCache(tmp_path / "cache"), max_workers=3)
    assert sorted(caught.value.errors) == [0, 7]
    assert sum(r is not None for r in caught.value.results) == 12
    assert not (tmp_path / ".json").exists()
