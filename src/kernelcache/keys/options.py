"""How each ProgramOptions field enters a key: the policy tables and the canonical encoding.

NVRTC (c++) reads every field, classified in ONE table, ``OPTION_POLICY`` (hashed, ignored,
tracked headers, needs extra_digest, refused); the PTX linker reads a few fields through
gates (``LINKER_GATES``, the same as cuda.core's own key); NVVM reads the rest, use_libdevice
by truth. A test fails when cuda.core grows a field the table does not classify.
"""

from __future__ import annotations

import functools
import marshal
from collections.abc import Sequence
from typing import Any

from kernelcache.keys.program_name import compiled_name
from kernelcache.memo import remember

HASH = "hash"  # can change the output (or the compile log we replay): its value is hashed
IGNORE = "ignore"  # cannot change output or log: left out so it causes no needless miss
TRACKED = "tracked"  # names files: needs extra_digest, unless compile_program tracks headers
NEEDS_DIGEST = "needs_extra_digest"  # reads files whose content the key cannot see
REJECT = "reject"  # a side effect (a file written) that a cache hit would skip

OPTION_POLICY: dict[str, str] = {
    "name": HASH,  # appears in diagnostics and debug info; its directory is searched for headers
    "arch": HASH,
    "relocatable_device_code": HASH,
    "extensible_whole_program": HASH,
    "debug": HASH,
    "lineinfo": HASH,
    "device_code_optimize": HASH,
    # Order kept: ptxas applies its options left to right, so a later flag overrides an
    # earlier one ("-O3 -O0" differs from "-O0 -O3"). Every list below keeps its order for
    # the same reason (macros redefine, include dirs are searched in order).
    "ptxas_options": HASH,
    "max_register_count": HASH,
    "ftz": HASH,
    "prec_sqrt": HASH,
    "prec_div": HASH,
    "fma": HASH,
    "use_fast_math": HASH,
    "extra_device_vectorization": HASH,
    "link_time_optimization": HASH,
    "gen_opt_lto": HASH,
    "define_macro": HASH,
    "undefine_macro": HASH,
    "include_path": TRACKED,
    # The flag is hashed; the per-user directory it names is not (keys stay shareable across
    # users and machines). Its content is NOT pinned by the NVRTC build: NVRTC installs its
    # copy once into a user-writable directory and reads whatever that holds now, so
    # compile_program tracks its headers as a search directory's (headers.digests.bundled_roots).
    # A key made without header tracking and without extra_digest does not see them.
    "use_bundled_headers": HASH,
    "pre_include": TRACKED,
    "no_source_include": HASH,
    "std": HASH,
    "builtin_move_forward": HASH,
    "builtin_initializer_list": HASH,
    "disable_warnings": HASH,  # changes the log that a hit replays
    "restrict": HASH,
    "device_as_default_execution_space": HASH,
    "device_int128": HASH,
    "optimization_info": HASH,  # log
    "no_display_error_number": HASH,  # log
    "diag_error": HASH,
    "diag_suppress": HASH,
    "diag_warn": HASH,
    "brief_diagnostics": HASH,  # log
    "time": REJECT,  # NVRTC writes a timing file (the PTX linker's -time only logs: LINKER_GATES)
    "split_compile": HASH,  # a thread count, but NVRTC writes "-split-compile N" into the cubin
    "fdevice_syntax_only": HASH,
    "minimal": HASH,
    "no_cache": IGNORE,  # turns off the linker's in-process JIT cache: same output
    "fdevice_time_trace": REJECT,  # writes a trace file
    "device_float128": HASH,
    "frandom_seed": HASH,
    "ofast_compile": HASH,
    "pch": NEEDS_DIGEST,
    "create_pch": REJECT,  # writes a PCH file
    "use_pch": NEEDS_DIGEST,
    "pch_dir": NEEDS_DIGEST,
    "pch_verbose": HASH,
    "pch_messages": HASH,
    "instantiate_templates_in_pch": HASH,
    "extra_sources": HASH,  # NVVM's inline (name, source) pairs, content in the value; refused for c++
    # NVVM only, by truth. libdevice ships in the nvidia-nvvm wheel that the toolchain
    # identity pins; with a system NVVM the key needs extra_digest (cuda.core: always).
    "use_libdevice": HASH,
    "numba_debug": HASH,
}

# The PTX linker reads only these fields (cuda.core 1.2 turns ProgramOptions into
# LinkerOptions with them), each through the gate that decides what the linker receives;
# cuda.core's own key uses the same gates. Every other field is NVRTC's or NVVM's and is
# left out of a PTX key. A gate maps each value to what the linker sees, so two values
# with one gated value are the same link: debug=None and False, time=True and "t.csv".
PRESENCE = "presence"  # a flag when the value is not None
TRUTHY = "truthy"  # a flag when the value is truthy
IS_TRUE = "is_true"  # a flag only for True
TRISTATE = "tristate"  # None, or the value as a bool
IDENTITY = "identity"  # the value as it is
PTXAS = "ptxas"  # one -Xptxas=<s> per item, in order; a str is one item; empty is none

LINKER_GATES: dict[str, str] = {
    "name": IDENTITY,
    "arch": IDENTITY,
    "max_register_count": IDENTITY,
    "time": PRESENCE,  # the linker's -time logs to the info log: no file, so cacheable
    "link_time_optimization": TRUTHY,
    "debug": TRUTHY,
    "lineinfo": TRUTHY,
    "ftz": TRISTATE,
    "prec_div": TRISTATE,
    "prec_sqrt": TRISTATE,
    "fma": TRISTATE,
    "split_compile": IDENTITY,
    "ptxas_options": PTXAS,
    "no_cache": IS_TRUE,
}
# The driver's cuLink (the fallback when nvJitLink is absent) ignores these four, and
# cuda.core refuses the three below for it: such a link fails, so no key is made for it.
DRIVER_IGNORED = frozenset({"ftz", "prec_div", "prec_sqrt", "fma"})
DRIVER_UNSUPPORTED = ("time", "ptxas_options", "split_compile")
# NVVM reads use_libdevice by truth (False is None); NVRTC and the linker never read it.
NVVM_ONLY = frozenset({"use_libdevice", "extra_sources"})

# NVRTC emits a flag for these whenever the value is not None (it really receives
# --create-pch=False), so False counts as set for the refusal and extra_digest checks.
_FLAG_IF_NOT_NONE = frozenset({"create_pch", "time", "fdevice_time_trace", "use_pch", "pch_dir"})


def _names_something(value: Any) -> bool:
    """cuda.core's test for a str-or-list option: None, False and empty sequences (a range
    too) emit no flag; a str, even "", does (``--include-path=``)."""
    if value is None or value is False:
        return False
    if isinstance(value, str):
        return True
    if isinstance(value, Sequence):
        return len(value) > 0
    return True


def as_list(value: Any) -> list[str]:
    """None -> [], a str -> [it], any other iterable -> its items as str."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def emits_flag(name: str, value: Any) -> bool:
    """Whether NVRTC gets a flag for ProgramOptions field ``name`` set to ``value``.

    The one rule (cuda.core 1.2's) that the key, the directive scan and the decision to
    trace headers all use: ``include_path=""`` and ``[""]`` emit ``--include-path=``, which
    makes NVRTC search the current directory for <...> includes.
    """
    if name in _FLAG_IF_NOT_NONE:
        return value is not None
    if name == "pch":
        return bool(value)
    return _names_something(value)


def _gate(gate: str, value: Any) -> Any:
    """What the PTX linker receives for a value of a field with this gate."""
    if gate == PRESENCE:
        return value is not None
    if gate == TRUTHY:
        return bool(value)
    if gate == IS_TRUE:
        return value is True
    if gate == TRISTATE:
        return None if value is None else bool(value)
    if gate == PTXAS:
        if isinstance(value, str):
            return (value,)
        if isinstance(value, Sequence):
            return tuple(value) or None
    return value


def encode(value: Any) -> bytes:
    """A canonical, type-tagged, length-prefixed encoding (no two values share one)."""
    if value is None:
        return b"N"
    if value is True:
        return b"T"
    if value is False:
        return b"F"
    if isinstance(value, int):
        return b"i%d;" % value
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogatepass")
        return b"s%d:%s" % (len(raw), raw)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return b"b%d:%s" % (len(raw), raw)
    if isinstance(value, (list, tuple)):
        parts = [encode(v) for v in value]
        return b"l%d:%s" % (len(parts), b"".join(parts))
    if isinstance(value, float):
        return b"f" + encode(value.hex())
    # An enum or other object: its type and repr, tagged so it cannot pose as a str.
    return b"o" + encode(f"{type(value).__module__}.{type(value).__qualname__}:{value!r}")


@functools.cache
def _program_options_type() -> type:
    from cuda.core import ProgramOptions

    return ProgramOptions


_TAGS = {name: b"%d:%s" % (len(name), name.encode()) for name in OPTION_POLICY}


def _set_fields(options: Any) -> Any:
    """(field, value) pairs of the options, in field order (unset ones included: callers skip None).

    Attributes whose names start with "_" are cuda.core's own derived state (e.g. ``_name``,
    the encoded ``name``), not options: they are left out.
    """
    fields = getattr(options, "__dict__", None)
    if fields is not None:
        return fields.items()
    return ((name, getattr(options, name, None)) for name in OPTION_POLICY)


def options_fingerprint(options: Any) -> tuple[Any, ...] | None:
    """A hashable snapshot of a ProgramOptions' values, for memo keys; None if not a dataclass.

    Two options get equal fingerprints only if they encode alike: the field names in order,
    every value and every value's exact type (True == 1 == 1.0 and 0.0 == -0.0 in a tuple
    comparison, but they are different options to the key). ProgramOptions is mutable: take
    the fingerprint at each use; an object changed since is a new fingerprint, never a stale
    memo entry.
    """
    fields = getattr(options, "__dict__", None)
    if fields is None:
        return None
    values = tuple(fields.values())
    try:
        # marshal writes exact builtin types only (True and 1, 1.0 and -0.0, a list and a tuple,
        # str and bytes all differ; a subclass is refused), so equal bytes are equal values of
        # equal types; in C, 2x faster than a tuple of the types. Version 0: no "interned"
        # mark, so an equal string built at run time gives the same bytes.
        return (tuple(fields), marshal.dumps(values, 0))
    except ValueError:
        # An enum, a Path or another object: its type and repr (every builtin repr is exact).
        return ("repr", tuple(fields), tuple(map(type, values)), repr(values))


def option_components(
    options: Any, code_type: str, has_digest: bool, headers_tracked: bool, driver_linker: bool = False
) -> bytes:
    """Encoded (field, value) pairs of every set field that can change the output.

    Unset (None) fields are left out: the field names are in the encoding, so leaving
    them out cannot make two different option sets collide. A field the policy table does
    not know (a newer cuda.core) is hashed: fail closed. PTX keys hash the linker's fields
    only, through their gates (``LINKER_GATES``).
    """
    if not isinstance(options, _program_options_type()):
        raise TypeError(f"options must be a cuda.core.ProgramOptions or None, not {type(options).__name__}")
    # No memo here: encoding the few set fields costs less than fingerprinting all of them
    # (compile_program memoises whole key derivations, where that pays).
    if code_type == "ptx":
        return _encode_linker_options(options, driver_linker)
    return _encode_options(options, code_type, has_digest, headers_tracked)


def _encode_linker_options(options: Any, driver_linker: bool) -> bytes:
    if getattr(options, "extra_sources", None):
        raise ValueError("ProgramOptions.extra_sources is for NVVM input only; Program refuses it for ptx")
    parts = []
    for name, gate in LINKER_GATES.items():
        value = getattr(options, name, None)
        if driver_linker and name in DRIVER_UNSUPPORTED and value is not None:
            raise ValueError(
                f"ProgramOptions.{name} is not supported by the driver linker (cuLink), which links "
                "PTX here because nvJitLink is not installed; the compile would fail, so no key is made"
            )
        if driver_linker and name in DRIVER_IGNORED:
            continue
        gated = _gate(gate, value)
        if gated == _gate(gate, None) and type(gated) is type(_gate(gate, None)):
            continue  # the linker receives nothing for it, as for None
        parts.append(_TAGS[name] + encode(gated))
    return b"".join(parts)


# (field, value, type) -> encoded bytes, per code type, for the HASH fields: what one
# process passes is a handful of distinct values, so most encodings are a dict look-up.
_PAIR_MEMO: dict[str, dict[tuple[str, Any, type], bytes]] = {"c++": {}, "nvvm": {}}
_SCALARS = (str, bool, int, float, bytes)


def _encode_options(options: Any, code_type: str, has_digest: bool, headers_tracked: bool) -> bytes:
    parts = []
    memo = _PAIR_MEMO[code_type]
    nvrtc = code_type == "c++"
    for name, value in _set_fields(options):
        if nvrtc and name == "name":
            value = compiled_name(options, code_type)  # not options.name: see program_name.py
        if value is None or name[:1] == "_":
            continue
        if name == "define_macro":
            value = macro_flags(value)
        try:
            parts.append(memo[(name, value, type(value))])
            continue
        except (KeyError, TypeError):  # not seen yet, or an unhashable (list) value
            pass
        policy = OPTION_POLICY.get(name, HASH)
        if policy == IGNORE:
            continue
        if name in NVVM_ONLY:
            if nvrtc:
                if name == "extra_sources" and value:
                    raise ValueError("ProgramOptions.extra_sources is for NVVM input only; Program refuses it for c++")
                continue  # NVRTC never reads use_libdevice
            if name == "use_libdevice":
                if not value:
                    continue  # read by truth: False is None
                value = True
        if nvrtc and not _nvrtc_keys(name, value, policy, has_digest, headers_tracked):
            continue
        tag = _TAGS.get(name) or b"%d:%s" % (len(name), name.encode())
        encoded = tag + encode(value)
        parts.append(encoded)
        # Only fields without checks may skip the code above next time, and only scalars: in a
        # tuple, ("N", 1) == ("N", True) although they encode differently.
        if policy == HASH and name not in NVVM_ONLY and name != "name" and type(value) in _SCALARS:
            remember(memo, (name, value, type(value)), encoded, 4096)
    return b"".join(parts)


def macro_flags(value: Any) -> Any:
    """define_macro as the macros NVRTC receives, by cuda.core's rule, so the key tells them apart.

    A str is one macro, a ("NAME", "VALUE") tuple one "NAME=VALUE", a list each of its items:
    ("N", "4") is -DN=4 (as "N=4" and [("N", "4")] are), but ["N", "4"] is -DN -D4, and
    list and tuple encode alike. A form cuda.core refuses is returned as it is (that
    compile fails, and nothing is stored for it).
    """
    items = value if isinstance(value, list) else [value]
    out = []
    for macro in items:
        if isinstance(macro, str):
            out.append(macro)
        elif isinstance(macro, tuple) and len(macro) == 2 and all(isinstance(part, str) for part in macro):
            out.append(f"{macro[0]}={macro[1]}")
        else:
            return value
    return out


def _nvrtc_keys(name: str, value: Any, policy: str, has_digest: bool, headers_tracked: bool) -> bool:
    """Whether an NVRTC field enters the key; ValueError for a value no key can stand for."""
    if policy == REJECT:
        if emits_flag(name, value):
            raise ValueError(
                f"ProgramOptions.{name}={value!r} makes NVRTC write a file as a side effect (it receives "
                "the flag for any value but None, False included), which a cache hit would skip; "
                "compile without the cache for this option"
            )
        return False
    if policy in (NEEDS_DIGEST, TRACKED):
        if not emits_flag(name, value):
            return False  # NVRTC receives nothing for it, as for None (include_path=())
        if policy == NEEDS_DIGEST and not has_digest:
            raise ValueError(
                f"ProgramOptions.{name} makes the compile read files whose content the key cannot "
                "see; pass extra_digest=<bytes that change whenever those files change>"
            )
        if policy == TRACKED and not has_digest and not headers_tracked:
            raise ValueError(
                f"ProgramOptions.{name} names headers whose content the key cannot see; use "
                "kernelcache.compile_program (it tracks the headers a compile reads), or pass "
                "extra_digest=<bytes that change whenever those headers change>"
            )
    if name == "name" and not has_digest and not headers_tracked and _has_directory(value):
        raise ValueError(
            f"ProgramOptions.name={value!r} has a directory component, and NVRTC reads quoted "
            "#includes relative to it, which the key cannot see; use kernelcache.compile_program "
            "(it tracks the headers a compile reads), pass extra_digest=<bytes that change "
            "whenever those headers change>, or drop the directory from the name"
        )
    return True


def _has_directory(name: object) -> bool:
    return isinstance(name, str) and ("/" in name or "\\" in name)
