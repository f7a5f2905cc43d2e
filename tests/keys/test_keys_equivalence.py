"""Key equivalences and refusals shared with cuda.core's own key.

Where cuda.core's make_program_cache_key proves two inputs compile to the same output,
kernelcache's key is the same too; where cuda.core refuses (a side effect a hit would skip,
files the key cannot see), kernelcache refuses with a message saying what to do. Every
hashed ProgramOptions field is shown to change the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from cuda.core import Program, ProgramOptions
from helpers import ARCH
from hypothesis import HealthCheck, given, settings
from option_sets import close_pairs, compile_kinds

from kernelcache import make_program_cache_key
from kernelcache.keys import derive as keys_mod
from kernelcache.keys import options as options_mod
from kernelcache.keys.toolchain import Toolchain, toolchain_for

SRC = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }'
NVVM_SRC = 'target triple = "nvptx64-nvidia-cuda"\n'


def key(code: Any = SRC, code_type: str = "c++", target_type: str = "cubin", **kw: Any) -> bytes:
    options = kw.pop("options", None) or ProgramOptions(arch=ARCH)
    return make_program_cache_key(code=code, code_type=code_type, options=options, target_type=target_type, **kw)


def opts(**kw: Any) -> ProgramOptions:
    return ProgramOptions(**{"arch": ARCH, **kw})


def ptx_source() -> str:
    from kernelcache import InMemoryProgramCache, compile_program

    return bytes(compile_program(SRC, "c++", "ptx", options=opts(), cache=InMemoryProgramCache()).code).decode()


def ptx_key(**kw: Any) -> bytes:
    return key(code=".version 8.0\n.target sm_90\n", code_type="ptx", options=opts(**kw))


# -- every hashed field changes the key (each field, none skipped on RuntimeError) ------------

# One value per hashed field that differs from "unset"; a field the table hashes but this
# dict lacks fails the test below, so a new cuda.core field cannot go untested.
CHANGED = {
    "name": "other_name",
    "arch": "sm_80",
    "split_compile": 2,  # NVRTC writes "-split-compile 2" into the cubin
    "relocatable_device_code": True,
    "extensible_whole_program": True,
    "debug": True,
    "lineinfo": True,
    "device_code_optimize": True,
    "ptxas_options": ["-v"],
    "max_register_count": 32,
    "ftz": True,
    "prec_sqrt": False,
    "prec_div": False,
    "fma": False,
    "use_fast_math": True,
    "extra_device_vectorization": True,
    "link_time_optimization": True,
    "gen_opt_lto": True,
    "define_macro": "N=4",
    "undefine_macro": "N",
    "include_path": ["/nonexistent/include"],
    "use_bundled_headers": True,
    "pre_include": "stdint.h",
    "no_source_include": True,
    "std": "c++17",
    "builtin_move_forward": False,
    "builtin_initializer_list": False,
    "disable_warnings": True,
    "restrict": True,
    "device_as_default_execution_space": True,
    "device_int128": True,
    "optimization_info": "inline",
    "no_display_error_number": True,
    "diag_error": [177],
    "diag_suppress": [177],
    "diag_warn": [177],
    "brief_diagnostics": True,
    "fdevice_syntax_only": True,
    "minimal": True,
    "device_float128": True,
    "frandom_seed": "1234",
    "ofast_compile": "max",
    "pch": True,
    "use_pch": "a.pch",
    "pch_dir": "pchdir",
    "pch_verbose": True,
    "pch_messages": True,
    "instantiate_templates_in_pch": True,
    "numba_debug": True,
    # NVVM only (c++ ignores use_libdevice and refuses extra_sources): checked under nvvm.
    "use_libdevice": True,
    "extra_sources": [("extra.ll", NVVM_SRC)],
}


def test_every_hashed_field_changes_the_key() -> None:
    hashed = {
        f for f, p in options_mod.OPTION_POLICY.items() if p in (options_mod.HASH, options_mod.TRACKED, options_mod.NEEDS_DIGEST)
    }
    assert hashed == set(CHANGED), "give CHANGED a value for every hashed field"
    digest = b"headers-v1"  # lets TRACKED / NEEDS_DIGEST fields through, for both keys alike
    seen: dict[bytes, str] = {}
    for field, value in CHANGED.items():
        ct, tt, code = ("nvvm", "ptx", NVVM_SRC) if field in options_mod.NVVM_ONLY else ("c++", "cubin", SRC)
        base = key(code=code, code_type=ct, target_type=tt, extra_digest=digest)
        k = key(code=code, code_type=ct, target_type=tt, options=opts(**{field: value}), extra_digest=digest)
        assert k != base, field
        assert k not in seen, (field, seen.get(k))
        seen[k] = field


def test_every_linker_field_changes_a_ptx_key_and_no_other_does() -> None:
    base = ptx_key()
    linker_values = {**CHANGED, "time": True, "split_compile": 2, "no_cache": True}
    for field in options_mod.OPTION_POLICY:
        if field == "extra_sources":
            continue  # refused for PTX (test_extra_sources_are_refused_outside_nvvm)
        if field in ("time", "split_compile", "no_cache", "create_pch", "fdevice_time_trace"):
            value = {"time": True, "split_compile": 2, "no_cache": True}.get(field, "x")
        else:
            value = linker_values[field]
        changed = ptx_key(**{field: value})
        if field in options_mod.LINKER_GATES:
            assert changed != base, field
        else:
            assert changed == base, field


# -- equivalences ----------------------------------------------------------------------------


def test_name_expressions_order_does_not_count_but_their_type_does() -> None:
    assert key(name_expressions=("f<int>", "g")) == key(name_expressions=["g", "f<int>"])
    assert key(name_expressions=("f",)) != key(name_expressions=(b"f",))
    assert key(name_expressions=("f", "f")) != key(name_expressions=("f",))


@pytest.mark.parametrize("bad", [123, None, bytearray(b"f")])
def test_name_expressions_of_another_type_are_refused_for_nvrtc(bad: object) -> None:
    with pytest.raises(TypeError, match="name_expressions"):
        key(name_expressions=("ok", bad))


def test_ptx_and_nvvm_ignore_name_expressions() -> None:
    assert ptx_key() == key(
        code=".version 8.0\n.target sm_90\n", code_type="ptx", options=opts(), name_expressions=("k", 3)
    )
    nvvm = {"code": NVVM_SRC, "code_type": "nvvm", "target_type": "ptx"}
    assert key(**nvvm) == key(**nvvm, name_expressions=("k",))


@pytest.mark.parametrize(
    "field_values",
    [
        {"define_macro": "N=4"},
        {"std": "c++17"},
        {"numba_debug": True},
        {"include_path": "/nonexistent"},
        {"pch": True},
        {"use_pch": "a.pch"},
        {"frandom_seed": "1"},
        {"use_libdevice": True},
    ],
)
def test_ptx_ignores_options_only_nvrtc_or_nvvm_read(field_values: dict) -> None:
    assert ptx_key(**field_values) == ptx_key()


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"debug": None}, {"debug": False}),
        ({"lineinfo": None}, {"lineinfo": False}),
        ({"link_time_optimization": None}, {"link_time_optimization": False}),
        ({"no_cache": None}, {"no_cache": False}),
        ({"time": True}, {"time": "timing.csv"}),
        ({"ptxas_options": "-v"}, {"ptxas_options": ["-v"]}),
        ({"ptxas_options": ["-v"]}, {"ptxas_options": ("-v",)}),
        ({"ptxas_options": None}, {"ptxas_options": []}),
        ({"ptxas_options": None}, {"ptxas_options": ()}),
    ],
)
def test_ptx_linker_equivalent_values_share_a_key(a: dict, b: dict) -> None:
    assert ptx_key(**a) == ptx_key(**b)


def test_ptx_linker_keeps_what_changes_the_link() -> None:
    assert ptx_key(ptxas_options=["-O3", "-O0"]) != ptx_key(ptxas_options=["-O0", "-O3"])
    assert ptx_key(ftz=True) != ptx_key(ftz=False) != ptx_key()
    assert ptx_key(debug=True) != ptx_key(debug=False)


def test_ptx_linker_equivalences_are_real_links() -> None:
    """The gates say what the linker receives: the links themselves give the same cubin."""
    ptx = ptx_source()

    def link(**kw: Any) -> bytes:
        program = Program(ptx, "ptx", options=opts(**kw))
        try:
            return bytes(program.compile("cubin").code)
        finally:
            program.close()

    assert link(debug=None) == link(debug=False)
    assert link(ptxas_options="-O2") == link(ptxas_options=["-O2"])
    assert link(ptxas_options=None) == link(ptxas_options=[])
    assert link(define_macro="N=4", std="c++17") == link()


@pytest.mark.parametrize("code_type", ["c++", "ptx"])
def test_use_libdevice_is_ignored_outside_nvvm(code_type: str) -> None:
    code = SRC if code_type == "c++" else ".version 8.0\n"
    keys = {key(code=code, code_type=code_type, options=opts(use_libdevice=v)) for v in (None, False, True)}
    assert len(keys) == 1


def test_nvvm_use_libdevice_false_is_none_and_true_differs() -> None:
    nvvm = {"code": NVVM_SRC, "code_type": "nvvm", "target_type": "ptx"}
    assert key(**nvvm, options=opts(use_libdevice=False)) == key(**nvvm, options=opts(use_libdevice=None))
    assert key(**nvvm, options=opts(use_libdevice=True)) != key(**nvvm)


def test_nvvm_use_libdevice_needs_extra_digest_only_where_no_wheel_pins_it() -> None:
    common = {"code": NVVM_SRC, "code_type": "nvvm", "target_type": "ptx", "options": opts(use_libdevice=True)}
    wheel = Toolchain(cuda_core="cuda-core==1.2.2", compiler="libnvvm.so.4;73647008;6629d5f654c5;wheel")
    keys_mod.key_components(**common, toolchain=wheel)  # libdevice is in the pinned wheel
    system = Toolchain(cuda_core="cuda-core==1.2.2", compiler="libnvvm.so.4.0.0;73647008;6629d5f654c5")
    with pytest.raises(ValueError, match="libdevice.*extra_digest"):
        keys_mod.key_components(**common, toolchain=system)
    keys_mod.key_components(**common, toolchain=system, extra_digest=b"libdevice-digest")


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["create_pch", "time", "fdevice_time_trace"])
@pytest.mark.parametrize("value", ["out.file", "", False])
def test_nvrtc_side_effect_options_are_refused_for_any_value_but_none(field: str, value: object) -> None:
    with pytest.raises(ValueError, match="side effect.*False included"):
        key(options=opts(**{field: value}))
    with pytest.raises(ValueError, match="side effect"):
        key(options=opts(**{field: value}), extra_digest=b"digest")


@pytest.mark.parametrize("value", [True, "timing.csv"])
def test_ptx_linker_time_is_a_key_not_a_refusal(value: object) -> None:
    assert len(ptx_key(time=value)) == 32


def test_driver_linker_refuses_what_it_cannot_link_and_ignores_what_it_drops() -> None:
    driver = Toolchain(cuda_core="cuda-core==1.2.2", compiler="driver:13000")
    nvjitlink = toolchain_for("ptx")

    def comps(tc: Toolchain, **kw: Any) -> list[tuple[str, bytes]]:
        return keys_mod.key_components(
            code=".version 8.0\n", code_type="ptx", options=opts(**kw), target_type="cubin", toolchain=tc
        )

    for field, value in (("time", False), ("ptxas_options", []), ("split_compile", 0)):
        with pytest.raises(ValueError, match="driver linker"):
            comps(driver, **{field: value})
        comps(nvjitlink, **{field: value})
    assert comps(driver, ftz=True) == comps(driver, ftz=False)
    assert comps(nvjitlink, ftz=True) != comps(nvjitlink, ftz=False)


@pytest.mark.parametrize(
    "field_value",
    [{"use_pch": False}, {"pch_dir": False}, {"use_pch": ""}, {"pre_include": ""}, {"include_path": range(1)}],
)
def test_flags_nvrtc_receives_for_false_or_empty_need_extra_digest(field_value: dict) -> None:
    with pytest.raises(ValueError, match="extra_digest"):
        key(options=opts(**field_value))
    assert len(key(options=opts(**field_value), extra_digest=b"d")) == 32


@pytest.mark.parametrize(
    "field_value",
    [{"include_path": False}, {"include_path": []}, {"include_path": range(0)}, {"pre_include": ()}, {"pch": False}],
)
def test_values_nvrtc_ignores_need_nothing(field_value: dict) -> None:
    assert len(key(options=opts(**field_value))) == 32


@pytest.mark.parametrize("name", ["kernels/foo.cu", "kernels\\foo.cu", "/abs/foo.cu", "../up/foo.cu"])
def test_name_with_a_directory_needs_tracking_or_extra_digest(name: str) -> None:
    with pytest.raises(ValueError, match="directory component"):
        key(options=opts(name=name))
    assert len(key(options=opts(name=name), extra_digest=b"d")) == 32
    # compile_program tracks the headers a compile reads, so it accepts the name as it is
    keys_mod.key_components(
        code=SRC, code_type="c++", options=opts(name=name), target_type="cubin", headers_tracked=True
    )
    assert len(key(options=opts(name="foo.cu"))) == 32


@pytest.mark.parametrize(("code_type", "code"), [("c++", SRC), ("ptx", ".version 8.0\n")])
def test_extra_sources_are_refused_outside_nvvm(code_type: str, code: str) -> None:
    with pytest.raises(ValueError, match="extra_sources"):
        key(code=code, code_type=code_type, options=opts(extra_sources=[("a.ll", NVVM_SRC)]))


def test_impossible_target_names_what_is_valid() -> None:
    with pytest.raises(ValueError, match="not valid for code_type"):
        key(code=".version 8.0\n", code_type="ptx", target_type="ltoir")


def test_the_table_is_one_place() -> None:
    # Every field named by a per-backend rule is a ProgramOptions field of the policy table.
    fields = {f.name for f in dataclasses.fields(ProgramOptions)}
    assert set(options_mod.LINKER_GATES) <= fields
    assert fields >= options_mod.NVVM_ONLY
    assert set(options_mod.LINKER_GATES) >= options_mod.DRIVER_IGNORED
    assert set(options_mod.DRIVER_UNSUPPORTED) <= set(options_mod.LINKER_GATES)


# -- parity with cuda.core's own key, over random option sets --------------------------------

# kernelcache leaves no_cache out of a key (the linker's in-process cache: the same output);
# cuda.core hashes the flag. Every other input cuda.core's key tells apart, ours does too.
_LEFT_OUT_BY_DESIGN = frozenset({"no_cache"})


def _both_keys(code_type: str, target_type: str, fields: dict) -> tuple[Any, Any]:
    """(cuda.core's key or its exception type, kernelcache's key or its exception type)."""
    from cuda.core.utils import make_program_cache_key as cuda_core_key
    from option_sets import EXTRA_DIGEST, SOURCES

    out = []
    for make in (cuda_core_key, make_program_cache_key):
        # use_libdevice: kernelcache's key pins the nvidia-nvvm wheel's libdevice, so it needs
        # no extra_digest where cuda.core's does; both get one here.
        args = {"code": SOURCES[code_type], "code_type": code_type, "target_type": target_type}
        try:
            out.append(make(**args, options=ProgramOptions(**fields), extra_digest=EXTRA_DIGEST))
        except Exception as exc:
            out.append(type(exc))
    return out[0], out[1]


@given(kind=compile_kinds(), pair=close_pairs())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_refusals_and_distinctions_match_cuda_cores_key(kind, pair) -> None:
    a_core, a_ours = _both_keys(*kind, pair[0])
    b_core, b_ours = _both_keys(*kind, pair[1])
    for core, ours, fields in ((a_core, a_ours, pair[0]), (b_core, b_ours, pair[1])):
        # Refused by one, refused by the other, with the same exception type (kernelcache
        # refuses more only where it would otherwise pass a mangled value on: arguments.py).
        assert isinstance(core, bytes) == isinstance(ours, bytes), (kind, fields, core, ours)
        if not isinstance(core, bytes):
            assert core is ours, (kind, fields, core, ours)
    if not isinstance(a_core, bytes) or not isinstance(b_core, bytes):
        return
    changed = {f for f in pair[0].keys() | pair[1].keys() if pair[0].get(f) != pair[1].get(f)}
    if a_ours == b_ours and not changed & _LEFT_OUT_BY_DESIGN:
        assert a_core == b_core, (kind, pair)  # never one key for what cuda.core tells apart


# cuda.core's tests of its key re-aimed at kernelcache: NVVM refuses NVRTC's options, and the
# key says so as the compile would (cuda.core's key: its option formatting for NVVM raises).
@pytest.mark.parametrize(
    "fields",
    [
        {"std": "c++17"},
        {"lineinfo": True},
        {"use_fast_math": True},
        {"define_macro": "N=4"},
        {"include_path": "/inc"},
        {"max_register_count": 32},
        {"ptxas_options": "-v"},
        {"restrict": True},
        {"time": True},
        {"split_compile": 2},
    ],
    ids=lambda f: next(iter(f)),
)
@pytest.mark.parametrize("target_type", ["ptx", "ltoir"])
def test_nvvm_refuses_nvrtc_options_as_cuda_core_does(fields: dict, target_type: str) -> None:
    from cuda.core.utils import make_program_cache_key as cuda_core_key

    from kernelcache import InMemoryProgramCache, compile_program

    args = {"code": NVVM_SRC, "code_type": "nvvm", "options": opts(**fields), "target_type": target_type}
    with pytest.raises(Exception) as core:
        cuda_core_key(**args)
    with pytest.raises(type(core.value)) as compiled:
        Program(NVVM_SRC, "nvvm", options=opts(**fields)).compile(target_type)
    assert str(compiled.value) == str(core.value)
    with pytest.raises(type(core.value)) as ours:
        make_program_cache_key(**args)
    assert str(ours.value) == str(core.value)
    with pytest.raises(type(core.value)) as ours:
        compile_program(NVVM_SRC, "nvvm", target_type, options=opts(**fields), cache=InMemoryProgramCache())
    assert str(ours.value) == str(core.value)
