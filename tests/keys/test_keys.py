"""make_program_cache_key / explain_program_cache_key: what goes in, what raises, what is stable."""

from __future__ import annotations

import dataclasses

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, run_python
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelcache import explain_program_cache_key, make_program_cache_key
from kernelcache.keys import derive as keys_mod
from kernelcache.keys import options as options_mod
from kernelcache.keys import toolchain

SRC = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }'


def key(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "code": SRC,
        "code_type": "c++",
        "options": ProgramOptions(arch=ARCH),
        "target_type": "cubin",
    }
    args.update(overrides)
    return make_program_cache_key(**args)  # type: ignore[arg-type]


def test_fixed_length_and_deterministic() -> None:
    assert len(key()) == 32
    assert key() == key()


def test_deterministic_across_processes() -> None:
    code = (
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import make_program_cache_key as m\n"
        f"print(m(code={SRC!r}, code_type='c++', options=ProgramOptions(arch={ARCH!r}), "
        "target_type='cubin').hex())"
    )
    assert run_python(code).strip() == key().hex()


def test_case_insensitive_kinds() -> None:
    assert key(code_type="C++", target_type="CUBIN") == key()
    ptx = ".version 8.0\n.target sm_90\n"
    assert key(code=ptx, code_type="PTX", target_type="Cubin") == key(code=ptx, code_type="ptx")


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"code_type": "cuda"}, "unknown code_type"),
        ({"target_type": "elf"}, "unknown target_type"),
        ({"code_type": "ptx", "target_type": "ltoir"}, "cannot compile ptx to ltoir"),
        ({"target_type": "fatbin"}, "unknown target_type 'fatbin'"),
        ({"code_type": "nvvm", "target_type": "cubin"}, "cannot compile nvvm to cubin"),
    ],
)
def test_unknown_or_impossible_kinds_raise_value_error(overrides: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        key(**overrides)


def test_wrong_argument_types_raise_type_error() -> None:
    with pytest.raises(TypeError):
        key(code=123)
    with pytest.raises(TypeError):
        key(code_type=None)
    with pytest.raises(TypeError, match="ProgramOptions"):
        key(options={"arch": ARCH})
    with pytest.raises(TypeError):
        key(name_expressions="single")
    with pytest.raises(TypeError):
        key(name_expressions=[1])


def test_bytes_source_is_hashed_as_is() -> None:
    latin1 = ("// caf\xe9\n" + SRC).encode("latin-1")
    with pytest.raises(UnicodeDecodeError):
        latin1.decode("utf-8")
    assert len(key(code=latin1)) == 32
    assert key(code=latin1) != key(code=("// caf\xe9\n" + SRC).encode("utf-8"))
    assert key(code=SRC.encode()) == key(code=SRC)  # UTF-8 text and its bytes agree


# Every hashed field changing the key (all of them, no silent skips):
# tests/keys/test_keys_equivalence.py::test_every_hashed_field_changes_the_key


def test_list_order_is_kept_where_the_compiler_cares() -> None:
    a = key(options=ProgramOptions(arch=ARCH, ptxas_options=["-O3", "-O0"]))
    b = key(options=ProgramOptions(arch=ARCH, ptxas_options=["-O0", "-O3"]))
    assert a != b
    m1 = key(options=ProgramOptions(arch=ARCH, define_macro=["N=1", "N=2"]))
    m2 = key(options=ProgramOptions(arch=ARCH, define_macro=["N=2", "N=1"]))
    assert m1 != m2


def test_ignored_options_do_not_change_the_key() -> None:
    assert key(options=ProgramOptions(arch=ARCH, no_cache=True)) == key()
    # split_compile is a thread count, but NVRTC writes "-split-compile N" into the cubin.
    assert key(options=ProgramOptions(arch=ARCH, split_compile=4)) != key()


def test_policy_table_classifies_every_program_options_field() -> None:
    fields = {f.name for f in dataclasses.fields(ProgramOptions)}
    unclassified = fields - set(options_mod.OPTION_POLICY)
    assert not unclassified, f"classify these new ProgramOptions fields in OPTION_POLICY: {unclassified}"
    stale = set(options_mod.OPTION_POLICY) - fields
    assert not stale, f"OPTION_POLICY names fields ProgramOptions no longer has: {stale}"
    assert set(options_mod.OPTION_POLICY.values()) <= {
        options_mod.HASH,
        options_mod.IGNORE,
        options_mod.TRACKED,
        options_mod.NEEDS_DIGEST,
        options_mod.REJECT,
    }


@pytest.mark.parametrize(
    "opts", [{"include_path": ["/usr/include"]}, {"pre_include": "x.h"}, {"pch": True}, {"use_pch": "a.pch"}]
)
def test_unseen_file_inputs_need_extra_digest(opts: dict) -> None:
    with pytest.raises(ValueError, match="extra_digest"):
        key(options=ProgramOptions(arch=ARCH, **opts))
    with_digest = key(options=ProgramOptions(arch=ARCH, **opts), extra_digest=b"headers-v1")
    assert with_digest != key(options=ProgramOptions(arch=ARCH, **opts), extra_digest=b"headers-v2")


@pytest.mark.parametrize("opts", [{"create_pch": "x.pch"}, {"time": "t.csv"}, {"fdevice_time_trace": "t.json"}])
def test_side_effect_options_are_rejected(opts: dict) -> None:
    with pytest.raises(ValueError, match="side effect"):
        key(options=ProgramOptions(arch=ARCH, **opts))


@pytest.mark.parametrize("bad", [0, "", b"", "str", bytearray()])
def test_extra_digest_must_be_non_empty_bytes(bad: object) -> None:
    with pytest.raises(ValueError, match="extra_digest"):
        key(extra_digest=bad)


def test_extra_digest_and_name_expressions_enter_the_key() -> None:
    assert key(extra_digest=b"a") != key(extra_digest=b"b") != key()
    assert key(name_expressions=("f<int>",)) != key()
    assert key(name_expressions=("f<int>",)) != key(name_expressions=(b"f<int>",))


def test_options_none_without_a_gpu_says_what_to_do() -> None:
    try:
        ProgramOptions()
    except Exception:
        with pytest.raises(ValueError, match="arch="):
            key(options=None)
    else:  # pragma: no cover - on a GPU machine the default arch works
        assert len(key(options=None)) == 32


def test_toolchain_identities_name_each_library_file_and_its_build() -> None:
    import os

    for lib, ident in (("nvrtc", toolchain.nvrtc_identity()), ("nvJitLink", toolchain.ptx_linker_identity())):
        path, how = toolchain.library_file(lib, load=True)
        name, size, build = ident.removeprefix("nvJitLink:").split(";")
        assert (name, int(size)) == (os.path.basename(path), os.stat(path).st_size) and len(build) == 40
        assert how in ("loaded", "site-packages", "conda", "system")
    # NVVM comes as a wheel here (libdevice with it); elsewhere a CUDA toolkit's file.
    assert toolchain.nvvm_identity().startswith("libnvvm.so")


def test_each_compiler_has_its_own_toolchain_component() -> None:
    assert toolchain.toolchain_for("c++").compiler == toolchain.nvrtc_identity()
    assert toolchain.toolchain_for("ptx").compiler == toolchain.ptx_linker_identity()
    assert toolchain.toolchain_for("nvvm").compiler == toolchain.nvvm_identity()


NO_NVRTC = """
import json, sys
sys.path[:0] = json.loads(sys.argv[1])  # the venv's packages, but -S: site-packages is the base's
from cuda.core import ProgramOptions
from kernelcache import make_program_cache_key as m
from kernelcache.keys import toolchain
key = lambda: m(code='x', code_type='c++', options=ProgramOptions(arch=%r), target_type='cubin').hex()
print(json.dumps({"ident": toolchain.nvrtc_identity(), "keys": [key(), key()]}))
"""


def test_a_process_that_finds_no_nvrtc_gets_a_stable_key_of_its_own() -> None:
    """``python -S`` in a venv whose base interpreter has no CUDA wheels (and no CUDA toolkit on
    the system's search path): cuda.pathfinder finds no libnvrtc, nor does the key."""
    import ctypes.util
    import json
    import subprocess
    import sys

    if ctypes.util.find_library("nvrtc"):
        pytest.skip("the system's loader finds a libnvrtc here")
    out = subprocess.run(
        [sys.executable, "-S", "-c", NO_NVRTC % ARCH, json.dumps(sys.path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ident"] == "probe-failed:DynamicLibNotFoundError"
    assert got["keys"][0] == got["keys"][1] != key().hex()


def test_probes_run_once_per_process(monkeypatch) -> None:
    """The identity is read from the library file once per process (counted, not changed)."""
    calls = []
    real = toolchain.file_identity
    monkeypatch.setattr(toolchain, "file_identity", lambda path: calls.append(path) or real(path))
    monkeypatch.setattr(toolchain, "_identities", {})
    toolchain.toolchain_for.cache_clear()
    try:
        for _ in range(5):
            key()
        assert len(calls) == 1
    finally:
        monkeypatch.undo()
        toolchain.toolchain_for.cache_clear()


def test_key_derivation_does_not_load_nvrtc() -> None:
    code = (
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import make_program_cache_key as m\n"
        f"m(code='x', code_type='c++', options=ProgramOptions(arch={ARCH!r}), target_type='cubin')\n"
        "maps = open('/proc/self/maps').read()\n"
        "print('libnvrtc' in maps)  # the compiler library itself, not the bindings module\n"
    )
    assert run_python(code).strip() == "False"


def test_explain_names_the_differing_component() -> None:
    a = explain_program_cache_key(code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin")
    b = explain_program_cache_key(code=SRC, code_type="c++", options=ProgramOptions(arch="sm_80"), target_type="cubin")
    assert a["key"] == key().hex()
    differing = {name for name in a.keys() | b.keys() if a.get(name) != b.get(name)}
    assert differing == {"options.arch", "key"}
    assert a["toolchain.compiler"] == toolchain.nvrtc_identity()


# -- properties ------------------------------------------------------------------------

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.lists(st.text(max_size=3), max_size=3),
)


@given(a=_values, b=_values)
@settings(max_examples=300, deadline=None)
def test_encoding_is_injective(a: object, b: object) -> None:
    if a == b and type(a) is type(b):
        assert options_mod.encode(a) == options_mod.encode(b)
    elif not (isinstance(a, list) and isinstance(b, list) and a == b):
        assert options_mod.encode(a) != options_mod.encode(b)


@given(parts=st.lists(st.binary(max_size=6), min_size=2, max_size=4), cut=st.integers(0, 6))
@settings(max_examples=300, deadline=None)
def test_component_boundaries_cannot_shift(parts: list[bytes], cut: int) -> None:
    # Moving bytes from one component to its neighbour must change the digest.
    names = [f"c{i}" for i in range(len(parts))]
    moved = list(parts)
    n = min(cut, len(moved[0]))
    if n == 0:
        return
    moved[1] = moved[0][-n:] + moved[1]
    moved[0] = moved[0][:-n]
    assert keys_mod.digest_components(list(zip(names, parts))) != keys_mod.digest_components(list(zip(names, moved)))


@given(code=st.text(max_size=50), macro=st.text(max_size=10))
@settings(max_examples=100, deadline=None)
def test_distinct_sources_and_macros_give_distinct_keys(code: str, macro: str) -> None:
    k1 = key(code=code)
    k2 = key(code=code + " ")
    assert k1 != k2
    with_macro = key(code=code, options=ProgramOptions(arch=ARCH, define_macro=macro or "X"))
    assert with_macro != k1


def test_repeated_derivations_stay_exact_about_value_types() -> None:
    # The per-process encoding memo must not confuse values that compare equal.
    a = key(options=ProgramOptions(arch=ARCH, max_register_count=1))
    b = key(options=ProgramOptions(arch=ARCH, max_register_count=True))
    c = key(options=ProgramOptions(arch=ARCH, define_macro=[("N", "1")]))
    d = key(options=ProgramOptions(arch=ARCH, define_macro=[("N", "1")]))
    assert a != b and c == d
    assert key(options=ProgramOptions(arch=ARCH, max_register_count=1)) == a


def test_define_macro_keys_follow_the_macros_nvrtc_receives() -> None:
    from cuda.core import ProgramOptions

    from kernelcache import make_program_cache_key

    def key(macros: object) -> bytes:
        options = ProgramOptions(arch="sm_90", define_macro=macros)
        return make_program_cache_key(
            code="__global__ void k() {}", code_type="c++", options=options, target_type="cubin"
        )

    # ("N", "M") is -DN=M; ["N", "M"] is -DN -DM: two compiles, two keys.
    assert key(("N", "M")) != key(["N", "M"])
    # One macro however it is spelled: one key.
    assert key(("N", "4")) == key("N=4") == key(["N=4"]) == key([("N", "4")])
    assert key([("N", "4"), "M"]) == key(["N=4", "M"]) != key(["M", "N=4"])  # order kept


def test_an_options_object_mutated_between_two_calls_gets_the_key_of_its_new_values() -> None:
    """The options memo is keyed by the values, not the object: every change is seen, exact to the type."""
    options = ProgramOptions(arch=ARCH, max_register_count=1)
    first = key(options=options)
    assert key(options=options) == first
    options.max_register_count = True  # equal to 1 in a comparison, another option to the key
    assert key(options=options) == key(options=ProgramOptions(arch=ARCH, max_register_count=True)) != first
    options.max_register_count = 1
    assert key(options=options) == first
    options.define_macro = ("N", "4")
    with_macro = key(options=options)
    options.define_macro = ["N", "4"]  # -DN -D4, not -DN=4
    assert len({first, with_macro, key(options=options)}) == 3
    options.define_macro = None
    options.arch = "sm_80"
    assert key(options=options) not in (first, key(options=ProgramOptions(arch=ARCH, max_register_count=1)))


def test_options_are_encoded_once_per_distinct_value(monkeypatch) -> None:
    """A repeated derivation hashes its source and reuses its options' encoding (counted)."""
    calls = []
    real = keys_mod.option_components
    monkeypatch.setattr(keys_mod, "option_components", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(keys_mod, "_options_memo", {})
    options = ProgramOptions(arch=ARCH, std="c++17")
    keys = {key(code=f"{SRC} // {i}", options=options) for i in range(5)}
    assert len(keys) == 5 and len(calls) == 1
    key(options=ProgramOptions(arch=ARCH, std="c++17"))  # another object, the same values
    assert len(calls) == 1
    options.std = "c++20"
    key(options=options)
    assert len(calls) == 2


def test_a_refused_option_is_refused_at_every_call() -> None:
    """What raised once raises again: a refusal is never remembered as a usable encoding."""
    options = ProgramOptions(arch=ARCH, create_pch="x.pch")
    for _ in range(2):
        with pytest.raises(ValueError, match="create_pch"):
            key(options=options)
    options.create_pch = None
    assert key(options=options) == key()


def test_fingerprints_tell_apart_values_that_compare_equal() -> None:
    """True == 1 == 1.0 and 0.0 == -0.0 in Python; an options fingerprint keeps them apart."""
    fp = options_mod.options_fingerprint
    a, b = ProgramOptions(arch=ARCH), ProgramOptions(arch=ARCH)
    assert fp(a) == fp(b)
    for x, y in ((1, True), (1, 1.0), (0.0, -0.0), (("N", 1), ("N", True)), ([1], [True])):
        a.max_register_count, b.max_register_count = x, y
        assert x == y and fp(a) != fp(b)
    a.include_path, b.include_path = ["a"], ("a",)
    assert fp(a) != fp(b)
    assert fp(object()) is None


@pytest.mark.parametrize(
    "fields",
    [{}, {"std": "c++17"}, {"max_register_count": 1}, {"max_register_count": True}, {"define_macro": ["N=4", "M"]}],
)
@pytest.mark.parametrize(("code_type", "target_type"), [("c++", "cubin"), ("c++", "ptx"), ("ptx", "cubin")])
def test_a_repeated_key_is_the_key_derived_in_full(fields: dict, code_type: str, target_type: str) -> None:
    """The second derivation of a key (its options encoded, the digest around the source cut once)
    gives the bytes of the full derivation, str and bytes sources alike, and a mutation is seen."""
    options = ProgramOptions(arch=ARCH, **fields)
    for code in ("k1", "k2 longer source", b"k1", "\\u00e9"):
        kw = {"code": code, "code_type": code_type, "options": options, "target_type": target_type}
        full = keys_mod.digest_components(keys_mod.key_components(**kw))
        assert make_program_cache_key(**kw) == full
        assert make_program_cache_key(**kw) == full  # from the template
    options.arch = "sm_80"
    kw = {"code": "k1", "code_type": code_type, "options": options, "target_type": target_type}
    assert make_program_cache_key(**kw) == keys_mod.digest_components(keys_mod.key_components(**kw))


def test_a_repeated_key_sees_an_output_variable_set_since(monkeypatch) -> None:
    """The environment is read at every call: a variable that changes NVRTC's output, set between
    two derivations of one key, changes the second."""
    first = key()
    assert key() == first
    monkeypatch.setenv("FINALIZER_USE_LEGACY_ELF_BUILDER", "1")
    assert key() != first
    monkeypatch.delenv("FINALIZER_USE_LEGACY_ELF_BUILDER")
    assert key() == first
