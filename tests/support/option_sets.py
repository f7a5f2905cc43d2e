"""Random ProgramOptions for the key's property tests: each field set or not, in every form
cuda.core accepts for it (a str or a list, a (name, value) pair or "NAME=VALUE", None or
False, a str or a list of ptxas options), so that two draws often mean the same compile in
different spellings. One table, used by the key parity with cuda.core, by ``explain`` and by
the lockfile's round trip.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SOURCES = {
    "c++": 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 1.0f; }',
    "ptx": ".version 8.0\n.target sm_90\n.address_size 64\n",
    "nvvm": 'target triple = "nvptx64-nvidia-cuda"\n',
}
TARGETS = {"c++": ("cubin", "ptx", "ltoir"), "ptx": ("cubin",), "nvvm": ("ptx", "ltoir")}
EXTRA_DIGEST = b"the same headers for both"  # lets include_path / pre_include / pch through

_FLAG = [None, True, False]
FIELD_VALUES: dict[str, list[Any]] = {
    "arch": ["sm_80", "sm_90"],
    "name": ["default_program", "k.cu"],
    "define_macro": ["N=4", ("N", "4"), [("N", "4")], ["N=4"], ["N", "4"], "M", ["M", ("N", "4")], []],
    "undefine_macro": ["N", ["N"], ["N", "M"]],
    "include_path": ["/inc", ["/inc"], ["/inc", "/other"], [], ""],
    "pre_include": ["a.h", ["a.h"], []],
    "std": ["c++17", "c++20"],
    "debug": _FLAG,
    "lineinfo": _FLAG,
    "ftz": _FLAG,
    "prec_sqrt": _FLAG,
    "prec_div": _FLAG,
    "fma": _FLAG,
    "use_fast_math": _FLAG,
    "device_code_optimize": _FLAG,
    "link_time_optimization": _FLAG,
    "relocatable_device_code": _FLAG,
    "max_register_count": [None, 32, 64],
    "ptxas_options": [None, "-v", ["-v"], ("-v",), [], ["-O3", "-O0"], ["-O0", "-O3"]],
    "split_compile": [None, 0, 2],
    "time": [None, True, "t.csv"],
    "no_cache": _FLAG,
    "diag_suppress": [None, 177, [177], [177, 550]],
    "frandom_seed": [None, "1", "2"],
    "numba_debug": _FLAG,
    "use_libdevice": _FLAG,
    "restrict": _FLAG,
    "disable_warnings": _FLAG,
    "pch": _FLAG,
}


def option_fields() -> st.SearchStrategy[dict[str, Any]]:
    """A ProgramOptions keyword dict: arch always, any other field of FIELD_VALUES or not."""
    optional = {f: st.sampled_from(v) for f, v in FIELD_VALUES.items() if f != "arch"}
    return st.fixed_dictionaries({"arch": st.sampled_from(FIELD_VALUES["arch"])}, optional=optional)


def close_pairs() -> st.SearchStrategy[tuple[dict[str, Any], dict[str, Any]]]:
    """Two option dicts that differ in a few fields at most (equal keys are then common)."""

    def vary(first: dict[str, Any]) -> st.SearchStrategy[tuple[dict[str, Any], dict[str, Any]]]:
        changes = st.dictionaries(st.sampled_from(sorted(FIELD_VALUES)), st.none(), max_size=3).flatmap(
            lambda fields: st.fixed_dictionaries({f: st.sampled_from(FIELD_VALUES[f]) for f in fields})
        )
        return changes.map(lambda c: (first, {**first, **c}))

    return option_fields().flatmap(vary)


def compile_kinds() -> st.SearchStrategy[tuple[str, str]]:
    """(code_type, target_type) pairs cuda.core compiles."""
    return st.sampled_from([(ct, tt) for ct, tts in TARGETS.items() for tt in tts])
