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

KEY_SCHEMA_VERSION = 1

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
    "time": REJECT,  # writes a timing file
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
    "extra_sources": HASH,  # inline (name, source) pairs: their content is in the value
    "use_libdevice": HASH,  # libdevice content is pinned by the NVVM wheel identity
    "numba_debug": HASH,
}

_HASHED_FIELDS = tuple(f for f, p in OPTION_POLICY.items() if p in (HASH, TRACKED, NEEDS_DIGEST))


def _is_set(value: Any) -> bool:
    # None, False and empty sequences emit no compiler flag in cuda.core; anything else
    # does (even "" or 0 for path-like fields), so only these three count as "not set".
    if value is None or value is False:
        return False
    return not (isinstance(value, (list, tuple)) and len(value) == 0)


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


# (field, value, type) -> encoded bytes, for the HASH fields: what one process passes is a
# handful of distinct values, so most encodings are a dict look-up. Bounded.
_PAIR_MEMO: dict[tuple[str, Any, type], bytes] = {}
_SCALARS = (str, bool, int, float, bytes)


def _option_components(options: Any, code_type: str, has_digest: bool, headers_tracked: bool) -> bytes:
    """Encoded (field, value) pairs of every set field that can change the output.

    Unset (None) fields are left out: the field names are in the encoding, so leaving
    them out cannot make two different option sets collide. A field the policy table does
    not know (a newer cuda.core) is hashed: fail closed.
    """
    if not isinstance(options, _program_options_type()):
        raise TypeError(f"options must be a cuda.core.ProgramOptions or None, not {type(options).__name__}")
    parts = []
    memo = _PAIR_MEMO
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
        if policy == REJECT:
            if _is_set(value):
                raise ValueError(
                    f"ProgramOptions.{name} makes the compiler write a file as a side effect, which a "
                    "cache hit would skip; compile without the cache for this option"
                )
            continue
        if code_type == "c++" and policy in (NEEDS_DIGEST, TRACKED) and _is_set(value):
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
        tag = _TAGS.get(name) or b"%d:%s" % (len(name), name.encode())
        encoded = tag + _encode(value)
        parts.append(encoded)
        # Only fields without checks may skip the code above next time, and only scalars: in a
        # tuple, ("N", 1) == ("N", True) although they encode differently.
        if policy == HASH and type(value) in _SCALARS:
            remember(memo, (name, value, type(value)), encoded, 4096)
    return b"".join(parts)


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
        if not isinstance(n, (str, bytes)):
            raise TypeError(f"each name expression must be str or bytes, not {type(n).__name__}")
    # str and bytes stay distinct: symbol_mapping is keyed by the object the caller gave.
    return _encode(items)


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
        raise ValueError(f"cannot compile {ct} to {tt}; {ct} compiles to one of {sorted(SUPPORTED_TARGETS[ct])}")
    extra = _check_extra_digest(extra_digest)
    if options is None:
        options = _default_options()
    tc = toolchain if toolchain is not None else toolchain_for(ct)
    components = [
        ("schema", b"%d" % KEY_SCHEMA_VERSION),
        ("code_type", ct.encode()),
        ("target_type", tt.encode()),
        ("code", _code_bytes(code)),
        ("options", _option_components(options, ct, extra is not None, headers_tracked)),
        ("name_expressions", _name_expressions_bytes(name_expressions)),
        ("toolchain.cuda_core", tc.cuda_core.encode()),
        ("toolchain.compiler", tc.compiler.encode()),
    ]
    if extra is not None:
        components.append(("extra_digest", extra))
    return components


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

    Raises ValueError for unknown code/target types, an impossible code->target pair,
    options with side effects (create_pch, time, fdevice_time_trace), options that read
    files the key cannot see (include_path, pre_include, pch...) without ``extra_digest``,
    and an empty or non-bytes ``extra_digest``. TypeError for arguments of the wrong type.
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
