"""explain_program_cache_key speaks the key's own normalisation: it reports a difference
exactly when two keys differ, over the random option sets the key's parity with cuda.core is
proven on (option_sets), for every code type; spellings the key treats as one compile are
reported as no difference."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH
from hypothesis import HealthCheck, given, settings
from option_sets import EXTRA_DIGEST, SOURCES, close_pairs, compile_kinds

from kernelcache import explain_program_cache_key, make_program_cache_key


def _args(code_type: str, target_type: str, fields: dict[str, Any]) -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cuda.core's deprecation notes for a few fields
        options = ProgramOptions(**fields)
    return {
        "code": SOURCES[code_type],
        "code_type": code_type,
        "target_type": target_type,
        "options": options,
        "extra_digest": EXTRA_DIGEST,
    }


def _key_and_parts(args: dict[str, Any]) -> tuple[bytes, dict[str, str]] | None:
    try:
        key = make_program_cache_key(**args)
    except Exception:
        with pytest.raises(Exception):  # noqa: B017 - whatever the key refuses, explain refuses too
            explain_program_cache_key(**args)
        return None
    parts = explain_program_cache_key(**args)
    assert parts.pop("key") == key.hex()
    return key, parts


@given(kind=compile_kinds(), pair=close_pairs())
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_explain_reports_a_difference_exactly_when_the_keys_differ(kind, pair) -> None:
    a = _key_and_parts(_args(*kind, pair[0]))
    b = _key_and_parts(_args(*kind, pair[1]))
    if a is None or b is None:
        return
    differing = sorted(name for name in a[1].keys() | b[1].keys() if a[1].get(name) != b[1].get(name))
    if a[0] == b[0]:
        assert differing == [], (pair, differing)
    else:
        assert differing, pair


@pytest.mark.parametrize(
    ("code_type", "target_type", "a", "b"),
    [
        ("c++", "cubin", {"define_macro": ("N", "4")}, {"define_macro": "N=4"}),
        ("c++", "cubin", {"define_macro": [("N", "4")]}, {"define_macro": ["N=4"]}),
        ("ptx", "cubin", {"std": "c++17", "define_macro": "N=4"}, {}),
        ("ptx", "cubin", {"debug": False, "ptxas_options": "-v"}, {"ptxas_options": ["-v"]}),
        ("nvvm", "ptx", {"use_libdevice": False}, {}),
    ],
)
def test_spellings_of_one_compile_are_no_difference(code_type: str, target_type: str, a: dict, b: dict) -> None:
    parts_a = explain_program_cache_key(**_args(code_type, target_type, {"arch": ARCH, **a}))
    parts_b = explain_program_cache_key(**_args(code_type, target_type, {"arch": ARCH, **b}))
    assert parts_a == parts_b


def test_a_difference_is_shown_as_the_key_sees_it() -> None:
    plain = explain_program_cache_key(**_args("c++", "cubin", {"arch": ARCH, "define_macro": ("N", "4")}))
    assert plain["options.define_macro"] == "['N=4']"  # the macro NVRTC receives
    listed = explain_program_cache_key(**_args("c++", "cubin", {"arch": ARCH, "include_path": ["/inc"]}))
    single = explain_program_cache_key(**_args("c++", "cubin", {"arch": ARCH, "include_path": "/inc"}))
    assert (listed["options.include_path"], single["options.include_path"]) == ("['/inc']", "'/inc'")
    assert listed["key"] != single["key"]
