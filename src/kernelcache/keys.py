"""make_program_cache_key(): everything that can change the compiler's output goes into the key.

The key is SHA-256 over named, length-prefixed components (so no two different inputs can
run into each other), led by a schema version. ``explain_program_cache_key`` returns the
same components, each with its own digest, to show *why* two compiles got different keys.

Every ProgramOptions field is classified in ONE table, ``OPTION_POLICY``; a test fails when
cuda.core grows a field the table does not classify.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.memo import remember
from kernelcache.toolchain import Toolchain, toolchain_for

if TYPE_CHECKING:
    from cuda.core import ProgramOptions

KEY_SCHEMA_VERSION = 2  # 2: PTX keys read the linker's fields only; name expressions unordered

# code_type -> targets the compiler behind it can produce (cuda.core 1.2's Program).
SUPPORTED_TARGETS: dict[str, frozenset[str]] = {
    "c++": frozenset({"ptx", "cubin", "ltoir"}),
    "ptx": frozenset({"ptx", "cubin"}),
    "nvvm": frozenset({"ptx", "ltoir"}),
}
# Every target some code_type above compiles to (no supported compile produces a fatbin).
TARGET_TYPES = frozenset().union(*SUPPORTED_TARGETS.values())

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
    # The bundled headers are installed by NVRTC from its own copy, so their content is a
    # function of the NVRTC build that the toolchain component pins; the per-user directory
    # they land in is deliberately not hashed (keys stay shareable across users/machines).
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
    "split_compile": IGNORE,  # thread count for the compile: same output, faster or slower
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

_HASHED_FIELDS = tuple(f for f, p in OPTION_POLICY.items() if p in (HASH, TRACKED, NEEDS_DIGEST))


def _is_set(value: Any) -> bool:
    """Whether a str-or-list option (include_path, pre_include...) makes NVRTC emit a flag.

    None, False and empty sequences (a range too) emit none; a str, even "", does.
    """
    if value is None or value is False:
        return False
    if isinstance(value, str):
        return True
    if isinstance(value, Sequence):
        return len(value) > 0
    return True


def _emits_flag(name: str, value: Any) -> bool:
    """Whether NVRTC gets a flag for field ``name`` set to ``value`` (cuda.core 1.2's rules)."""
    if name in _FLAG_IF_NOT_NONE:
        return value is not None
    if name == "pch":
        return bool(value)
    return _is_set(value)


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


def _encode(value: Any) -> bytes:
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
        parts = [_encode(v) for v in value]
        return b"l%d:%s" % (len(parts), b"".join(parts))
    if isinstance(value, float):
        return b"f" + _encode(value.hex())
    # An enum or other object: its type and repr, tagged so it cannot pose as a str.
    return b"o" + _encode(f"{type(value).__module__}.{type(value).__qualname__}:{value!r}")


def _normalize_kind(value: object, what: str, allowed: frozenset[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, one of {sorted(allowed)}, not {type(value).__name__}")
    v = value.lower()
    if v not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(allowed)}")
    return v


def _default_options() -> ProgramOptions:
    from cuda.core import ProgramOptions

    try:
        return ProgramOptions()  # picks arch from the current device
    except Exception as exc:
        raise ValueError(
            "options=None needs a CUDA device to choose the target architecture, and none is "
            f"usable here ({type(exc).__name__}); pass ProgramOptions(arch='sm_90') (or your GPU's arch)"
        ) from exc


def _check_extra_digest(extra_digest: object) -> bytes | None:
    if extra_digest is None:
        return None
    if not isinstance(extra_digest, (bytes, bytearray)) or len(extra_digest) == 0:
        raise ValueError(
            f"extra_digest must be non-empty bytes (e.g. hashlib.sha256(header_bytes).digest()), got {extra_digest!r}"
        )
    return bytes(extra_digest)


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

    Field names and value types are part of it: True == 1 == 1.0 in a tuple comparison, but
    they are different options to the key.
    """
    fields = getattr(options, "__dict__", None)
    if fields is None:
        return None
    values = tuple(fields.values())
    try:
        hash(values)
    except TypeError:
        # A list value (include paths, macros). repr() of builtin values is exact, types
        # included ('True' vs '1', '[...]' vs '(...)'), and runs in C: 10x faster than
        # converting each value in Python.
        return ("repr", tuple(fields), repr(values))
    return (tuple(fields), values, tuple(map(type, values)))


def _option_components(
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
        parts.append(_TAGS[name] + _encode(gated))
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
        if value is None or name[:1] == "_":
            continue
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
        if nvrtc and policy == REJECT:
            if _emits_flag(name, value):
                raise ValueError(
                    f"ProgramOptions.{name}={value!r} makes NVRTC write a file as a side effect (it receives "
                    "the flag for any value but None, False included), which a cache hit would skip; "
                    "compile without the cache for this option"
                )
            continue
        if nvrtc and policy in (NEEDS_DIGEST, TRACKED) and _emits_flag(name, value):
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
        if nvrtc and name == "name" and not has_digest and not headers_tracked and _has_directory(value):
            raise ValueError(
                f"ProgramOptions.name={value!r} has a directory component, and NVRTC reads quoted "
                "#includes relative to it, which the key cannot see; use kernelcache.compile_program "
                "(it tracks the headers a compile reads), pass extra_digest=<bytes that change "
                "whenever those headers change>, or drop the directory from the name"
            )
        tag = _TAGS.get(name) or b"%d:%s" % (len(name), name.encode())
        encoded = tag + _encode(value)
        parts.append(encoded)
        # Only fields without checks may skip the code above next time, and only scalars: in a
        # tuple, ("N", 1) == ("N", True) although they encode differently.
        if policy == HASH and name not in NVVM_ONLY and name != "name" and type(value) in _SCALARS:
            remember(memo, (name, value, type(value)), encoded, 4096)
    return b"".join(parts)


def _has_directory(name: object) -> bool:
    return isinstance(name, str) and ("/" in name or "\\" in name)


def _code_bytes(code: object) -> bytes:
    if isinstance(code, str):
        # surrogatepass: a str that came from decoding bytes with surrogateescape still
        # encodes; valid text encodes exactly as UTF-8.
        return code.encode("utf-8", "surrogatepass")
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)  # hashed as given: non-UTF-8 source (a Latin-1 comment) is fine
    raise TypeError(f"code must be str or bytes, not {type(code).__name__}")


def _name_expressions_bytes(name_expressions: Sequence[Any]) -> bytes:
    if type(name_expressions) is tuple and not name_expressions:
        return b"l0:"  # the common case, same bytes as _encode(())
    if isinstance(name_expressions, (str, bytes)):
        raise TypeError("name_expressions must be a sequence of names, not a single str/bytes")
    items = list(name_expressions)
    for n in items:
        if type(n) is not str and type(n) is not bytes:
            raise TypeError(f"name_expressions items must be str or bytes, not {type(n).__name__}")
    # str and bytes stay distinct (symbol_mapping is keyed by the object the caller gave);
    # order does not count: each expression is looked up by itself, as cuda.core's key says.
    encoded = sorted(_encode(n) for n in items)
    return b"l%d:%s" % (len(encoded), b"".join(encoded))


def key_components(
    *,
    code: str | bytes,
    code_type: str,
    options: ProgramOptions | None,
    target_type: str,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | None = None,
    headers_tracked: bool = False,
    toolchain: Toolchain | None = None,
) -> list[tuple[str, bytes]]:
    """The named, encoded inputs of a key, in order. Validates every argument.

    ``headers_tracked=True`` is compile_program's promise to append the digest of the
    headers the compile read (see headers.py); include_path/pre_include are then accepted
    without extra_digest. ``toolchain`` is the probe result to use (computed once per
    process when None).
    """
    ct = _normalize_kind(code_type, "code_type", frozenset(SUPPORTED_TARGETS))
    tt = _normalize_kind(target_type, "target_type", TARGET_TYPES)
    if tt not in SUPPORTED_TARGETS[ct]:
        raise ValueError(
            f"cannot compile {ct} to {tt}: target_type {tt!r} is not valid for code_type {ct!r}; "
            f"{ct} compiles to one of {sorted(SUPPORTED_TARGETS[ct])}"
        )
    extra = _check_extra_digest(extra_digest)
    if options is None:
        options = _default_options()
    tc = toolchain if toolchain is not None else toolchain_for(ct)
    if ct == "nvvm" and extra is None and getattr(options, "use_libdevice", None) and not _pins_libdevice(tc):
        raise ValueError(
            "use_libdevice=True links a libdevice file that ships with no wheel here (a system NVVM: "
            f"{tc.compiler}), so the key cannot see it; pass extra_digest=<a digest of that libdevice file>"
        )
    components = [
        ("schema", b"%d" % KEY_SCHEMA_VERSION),
        ("code_type", ct.encode()),
        ("target_type", tt.encode()),
        ("code", _code_bytes(code)),
        ("options", _option_components(options, ct, extra is not None, headers_tracked, _driver_links(ct, tc))),
        # Only NVRTC reads name expressions; PTX and NVVM compiles ignore them.
        ("name_expressions", _name_expressions_bytes(name_expressions) if ct == "c++" else b"l0:"),
        ("toolchain.cuda_core", tc.cuda_core.encode()),
        ("toolchain.compiler", tc.compiler.encode()),
    ]
    if extra is not None:
        components.append(("extra_digest", extra))
    return components


def _pins_libdevice(tc: Toolchain) -> bool:
    # libdevice ships in the nvidia-nvvm wheel, whose exact build the identity names.
    return tc.compiler.startswith("nvidia-nvvm==")


def _driver_links(code_type: str, tc: Toolchain) -> bool:
    return code_type == "ptx" and tc.compiler.startswith("driver:")


@functools.cache
def _names_blob(names: tuple[str, ...]) -> bytes:
    return b"\0".join(name.encode() for name in names)


def digest_components(components: list[tuple[str, bytes]]) -> bytes:
    """SHA-256 over the component names, every value's length, then the values: 32 bytes.

    The names and the fixed-size lengths come first, so the boundaries of every value are
    fixed before any value is read: no two different inputs give the same hashed bytes.
    """
    names, values = zip(*components)
    blob = _names_blob(names)
    lengths = _lengths_struct(len(values)).pack(len(blob), *map(len, values))
    return hashlib.sha256(lengths + blob + b"".join(values)).digest()


@functools.cache
def _lengths_struct(n: int) -> struct.Struct:
    return struct.Struct(f"<{n + 1}Q")


def make_program_cache_key(
    *,
    code: str | bytes,
    code_type: str,
    options: ProgramOptions | None,
    target_type: str,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | None = None,
) -> bytes:
    """Return a 32-byte key that changes whenever the compiler's output could change.

    Covers the source (str as UTF-8, bytes as given), code and target type (case
    insensitive), every output-relevant ProgramOptions field (``OPTION_POLICY``), the name
    expressions, the exact toolchain build (cuda.core, and NVRTC / PTX linker / NVVM to the
    patch release), a schema version and ``extra_digest``.

    Inputs that cuda.core's own key proves equivalent share a key: name expressions in any
    order; for PTX only the linker's fields count, through their gates (``LINKER_GATES``);
    use_libdevice only for NVVM, False equal to None.

    Raises ValueError for unknown code/target types, an impossible code->target pair,
    NVRTC options with side effects (create_pch, time, fdevice_time_trace: any value but
    None, False included), options that read files the key cannot see (include_path,
    pre_include, pch, use_pch, pch_dir, a ``name`` with a directory part) without
    ``extra_digest``, extra_sources for c++/PTX, and an empty or non-bytes ``extra_digest``.
    TypeError for arguments of the wrong type.
    """
    return digest_components(
        key_components(
            code=code,
            code_type=code_type,
            options=options,
            target_type=target_type,
            name_expressions=name_expressions,
            extra_digest=extra_digest,
        )
    )


def explain_program_cache_key(
    *,
    code: str | bytes,
    code_type: str,
    options: ProgramOptions | None,
    target_type: str,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | None = None,
) -> dict[str, str]:
    """The key's components, each as a short hex digest, plus ``key``: the key's hex.

    Compare two results to see which input made two compiles get different keys; option
    fields are listed one by one (``options.<field>``). Readable values (types, toolchain
    identities) are shown as text.
    """
    components = key_components(
        code=code,
        code_type=code_type,
        options=options,
        target_type=target_type,
        name_expressions=name_expressions,
        extra_digest=extra_digest,
    )
    out: dict[str, str] = {}
    for name, value in components:
        if name in ("schema", "code_type", "target_type") or name.startswith("toolchain."):
            out[name] = value.decode()
        elif name == "options":
            out.update(_explain_options(options))
        else:
            out[name] = hashlib.sha256(value).hexdigest()[:16]
    out["key"] = digest_components(components).hex()
    return out


def _explain_options(options: Any) -> dict[str, str]:
    if options is None:
        options = _default_options()
    out = {}
    for name in _HASHED_FIELDS:
        value = getattr(options, name, None)
        if value is not None:
            out[f"options.{name}"] = repr(value)
    return out
