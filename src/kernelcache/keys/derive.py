"""make_program_cache_key(): everything that can change the compiler's output goes into the key.

The key is SHA-256 over named, length-prefixed components (so no two different inputs can
run into each other), led by a schema version. ``explain_program_cache_key`` returns the
same components, each with its own digest, to show *why* two compiles got different keys.

How each ProgramOptions field enters the key (the policy tables, the encoding) is options.py.
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.keys.arguments import check_as_cuda_core, check_path_fields
from kernelcache.keys.options import encode, option_components, options_fingerprint
from kernelcache.keys.toolchain import Toolchain, toolchain_for
from kernelcache.memo import remember

if TYPE_CHECKING:
    from cuda.core import ProgramOptions

# 2: PTX keys read the linker's fields only; name expressions unordered. 3: define_macro keyed
# as the macros NVRTC receives (a version-2 key of ("N", "4") is that of ["N", "4"]).
KEY_SCHEMA_VERSION = 3

# The environment variables known to change what the compilers produce, found by compiling with
# and without each variable libnvrtc reads (getenv, logged) and comparing the bytes (libnvrtc
# 13.5): FINALIZER_USE_LEGACY_ELF_BUILDER (read at every compile: a non-zero number gives
# another cubin), LLVM_OVERRIDE_PRODUCER (read once, when libnvrtc or libNVVM loads: named in
# every LTO-IR), NV_NVVM_VERSION (any value NVRTC 13.5 was tried with fails every compile).
# Where one is set, its value as given enters the key ("environment"); a compile in a worker
# runs with the caller's environment of that moment. Read but not changing the output:
# FINALIZER_CUBIE (writes a copy of each cubin to the file it names: a hit writes none),
# CAN_FINALIZE_DEBUG, NVVM_IR_VER_CHK, EDG_BASE, MAKEFLAGS, CUDA_CACHE_DISABLE. PWD names the
# working directory in -G, -lineinfo and LTO-IR output, as the working directory itself does.
OUTPUT_VARIABLES = ("FINALIZER_USE_LEGACY_ELF_BUILDER", "LLVM_OVERRIDE_PRODUCER", "NV_NVVM_VERSION")
_ENCODED_OUTPUT = tuple(os.fsencode(name) for name in OUTPUT_VARIABLES)
# On CPython for POSIX os.environ keeps the environment in this dict (bytes keys), which every
# os.environ write updates: a look-up there is what ``name in os.environ`` asks, minus the
# KeyError an unset name costs inside it (as config.env_get reads it).
_ENV_DATA = getattr(os.environ, "_data", None) if os.name == "posix" else None
if type(_ENV_DATA) is not dict:
    _ENV_DATA = None

# code_type -> targets the compiler behind it can produce (cuda.core 1.2's Program).
SUPPORTED_TARGETS: dict[str, frozenset[str]] = {
    "c++": frozenset({"ptx", "cubin", "ltoir"}),
    "ptx": frozenset({"ptx", "cubin"}),
    "nvvm": frozenset({"ptx", "ltoir"}),
}
# Every target some code_type above compiles to (no supported compile produces a fatbin).
TARGET_TYPES = frozenset().union(*SUPPORTED_TARGETS.values())


def _normalize_kind(value: object, what: str, allowed: frozenset[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, one of {sorted(allowed)}, not {type(value).__name__}")
    v = value.lower()
    if v not in allowed:
        raise ValueError(f"unknown {what} {value!r}; expected one of {sorted(allowed)}")
    return v


def default_options() -> ProgramOptions:
    """cuda.core's ProgramOptions() for the current device; ValueError naming the fix without one."""
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


def code_bytes(code: object) -> bytes:
    """A source as the bytes its key hashes: str as UTF-8, bytes-likes as given; else TypeError."""
    if isinstance(code, str):
        # surrogatepass: a str that came from decoding bytes with surrogateescape still
        # encodes; valid text encodes exactly as UTF-8.
        return code.encode("utf-8", "surrogatepass")
    if isinstance(code, (bytes, bytearray, memoryview)):
        return bytes(code)  # hashed as given: non-UTF-8 source (a Latin-1 comment) is fine
    raise TypeError(f"code must be str or bytes, not {type(code).__name__}")


def _name_expressions_bytes(name_expressions: Sequence[Any]) -> bytes:
    if type(name_expressions) is tuple and not name_expressions:
        return b"l0:"  # the common case, same bytes as encode(())
    if isinstance(name_expressions, (str, bytes)):
        raise TypeError("name_expressions must be a sequence of names, not a single str/bytes")
    items = list(name_expressions)
    for n in items:
        if type(n) is not str and type(n) is not bytes:
            raise TypeError(f"name_expressions items must be str or bytes, not {type(n).__name__}")
    # str and bytes stay distinct (symbol_mapping is keyed by the object the caller gave);
    # order does not count: each expression is looked up by itself, as cuda.core's key says.
    encoded = sorted(encode(n) for n in items)
    return b"l%d:%s" % (len(encoded), b"".join(encoded))


# What the options of a call encode to, validated, per distinct options value (its fingerprint:
# ProgramOptions is mutable, so the memo is keyed by the values, never by the object) and the
# arguments the encoding reads: a repeated key derivation hashes its source and nothing else.
_options_memo: dict[tuple[Any, ...], tuple[tuple[str, bytes], ...]] = {}
_OPTIONS_MEMO_LIMIT = 4096
# The usual spellings, lower case, as given: a dict look-up instead of lower() and two checks.
_CODE_TYPES = {kind: kind for kind in SUPPORTED_TARGETS}
_TARGET_TYPES = {kind: kind for kind in TARGET_TYPES}


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
    headers the compile read (see headers.manifests); include_path/pre_include are then accepted
    without extra_digest. ``toolchain`` is the probe result to use (computed once per
    process when None).
    """
    ct = _CODE_TYPES.get(code_type) if type(code_type) is str else None
    if ct is None:
        ct = _normalize_kind(code_type, "code_type", frozenset(SUPPORTED_TARGETS))
    tt = _TARGET_TYPES.get(target_type) if type(target_type) is str else None
    if tt is None:
        tt = _normalize_kind(target_type, "target_type", TARGET_TYPES)
    if tt not in SUPPORTED_TARGETS[ct]:
        raise ValueError(
            f"cannot compile {ct} to {tt}: target_type {tt!r} is not valid for code_type {ct!r}; "
            f"{ct} compiles to one of {sorted(SUPPORTED_TARGETS[ct])}"
        )
    extra = _check_extra_digest(extra_digest)
    if options is None:
        options = default_options()
    tc = toolchain if toolchain is not None else toolchain_for(ct)
    fingerprint = options_fingerprint(options)
    memo_key = None
    if fingerprint is not None:
        memo_key = (fingerprint, type(options), ct, tt, extra is not None, headers_tracked, tc.cuda_core, tc.compiler)
    fixed = None if memo_key is None else _options_memo.get(memo_key)
    known = fixed is not None  # then the checks below passed for this very value before
    if not known:
        _check_options(options, ct, extra, tc)
    source = code_bytes(code)
    if fixed is None:
        fixed = _fixed_components(options, ct, tt, extra is not None, headers_tracked, tc)
    # Only NVRTC reads name expressions; PTX and NVVM compiles ignore them.
    names = _name_expressions_bytes(name_expressions) if ct == "c++" else b"l0:"
    if not known:
        if ct != "ptx":  # after the key's own refusals, which say what to do instead
            check_as_cuda_core(options, ct, tt)
        if memo_key is not None:
            remember(_options_memo, memo_key, fixed, _OPTIONS_MEMO_LIMIT)
    components = [fixed[0], fixed[1], fixed[2], ("code", source), fixed[3], ("name_expressions", names), *fixed[4:]]
    environment = environment_bytes()
    if environment:
        components.append(("environment", environment))
    if extra is not None:
        components.append(("extra_digest", extra))
    return components


_SCHEMA = b"%d" % KEY_SCHEMA_VERSION


def _check_options(options: ProgramOptions, ct: str, extra: bytes | None, tc: Toolchain) -> None:
    """The refusals that come before the source's (libdevice without its digest, path fields)."""
    if ct == "nvvm" and extra is None and getattr(options, "use_libdevice", None) and not _pins_libdevice(tc):
        raise ValueError(
            "use_libdevice=True links a libdevice file that ships with no wheel here (a system NVVM: "
            f"{tc.compiler}), so the key cannot see it; pass extra_digest=<a digest of that libdevice file>"
        )
    if ct == "c++":
        check_path_fields(options)


def _fixed_components(
    options: ProgramOptions, ct: str, tt: str, has_digest: bool, headers_tracked: bool, tc: Toolchain
) -> tuple[tuple[str, bytes], ...]:
    """The components that depend on no more than the options, the kinds and the toolchain."""
    encoded = option_components(options, ct, has_digest, headers_tracked, _driver_links(ct, tc))
    return (
        ("schema", _SCHEMA),
        ("code_type", ct.encode()),
        ("target_type", tt.encode()),
        ("options", encoded),
        ("toolchain.cuda_core", tc.cuda_core.encode()),
        ("toolchain.compiler", tc.compiler.encode()),
    )


def environment_bytes() -> bytes:
    """The OUTPUT_VARIABLES set now, as ``NAME=value`` lines (b"" where none is: the usual case)."""
    data = _ENV_DATA
    if data is not None and not any(map(data.__contains__, _ENCODED_OUTPUT)):
        return b""  # none set: three look-ups in os.environ's own dict, no exception raised
    environ = os.environ
    set_now = [f"{name}={environ[name]}\n" for name in OUTPUT_VARIABLES if name in environ]
    return "".join(set_now).encode("utf-8", "surrogateescape")


def _pins_libdevice(tc: Toolchain) -> bool:
    # libdevice ships in the NVVM wheel, whose exact build the identity names (toolchain.nvvm_identity).
    return tc.compiler.endswith(";wheel")


def _driver_links(code_type: str, tc: Toolchain) -> bool:
    return code_type == "ptx" and tc.compiler.startswith("driver:")


def digest_components(components: list[tuple[str, bytes]]) -> bytes:
    """SHA-256 over the component names, every value's length, then the values: 32 bytes.

    The names and the fixed-size lengths come first, so the boundaries of every value are
    fixed before any value is read: no two different inputs give the same hashed bytes.
    """
    names, values = zip(*components)
    blob, lengths = _layout(names)
    return hashlib.sha256(b"".join((lengths.pack(len(blob), *map(len, values)), blob, *values))).digest()


@functools.cache
def _layout(names: tuple[str, ...]) -> tuple[bytes, struct.Struct]:
    """The names' blob and the struct of the lengths, for one list of component names."""
    return b"\0".join(name.encode() for name in names), struct.Struct(f"<{len(names) + 1}Q")


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
    plain = (
        type(code) in (str, bytes)
        and type(name_expressions) is tuple
        and not name_expressions
        and extra_digest is None
        and options is not None
    )
    if plain:
        fingerprint = options_fingerprint(options)
        template = _templates.get((fingerprint, type(options), code_type, target_type))
        if template is not None and template[0] is toolchain_for(template[1]) and not environment_bytes():
            _, _, head, middle, tail = template
            source = code.encode("utf-8", "surrogatepass") if type(code) is str else code
            return hashlib.sha256(b"".join((head, _LENGTH.pack(len(source)), middle, source, tail))).digest()
    components = key_components(
        code=code,
        code_type=code_type,
        options=options,
        target_type=target_type,
        name_expressions=name_expressions,
        extra_digest=extra_digest,
    )
    if plain and fingerprint is not None and len(components) == len(_PLAIN_NAMES):
        _remember_template((fingerprint, type(options), code_type, target_type), components)
    return digest_components(components)


# make_program_cache_key's repeated derivations: per (options fingerprint, code type, target
# type, as given) with no name expressions, extra digest or output variable, the bytes the
# digest reads around the source, cut from a key derived in full (so they are its bytes). A
# call then encodes and hashes its source, and checks that the toolchain is the one the
# template was made with (keys.toolchain.confirm can replace it) and the environment adds nothing.
_templates: dict[tuple[Any, ...], tuple[Toolchain, str, bytes, bytes, bytes]] = {}
_PLAIN_NAMES = (
    "schema",
    "code_type",
    "target_type",
    "code",
    "options",
    "name_expressions",
    "toolchain.cuda_core",
    "toolchain.compiler",
)
_LENGTH = struct.Struct("<Q")


def _remember_template(memo_key: tuple[Any, ...], components: list[tuple[str, bytes]]) -> None:
    names, values = zip(*components)
    if names != _PLAIN_NAMES:
        return
    blob, _ = _layout(names)
    lengths = [len(blob), *map(len, values)]
    at = names.index("code") + 1  # the source's length, in the lengths, after the blob's
    head = struct.pack(f"<{at}Q", *lengths[:at])
    middle = struct.pack(f"<{len(lengths) - at - 1}Q", *lengths[at + 1 :]) + blob + b"".join(values[: at - 1])
    tail = b"".join(values[at:])
    code_type = components[1][1].decode()
    template = (toolchain_for(code_type), code_type, head, middle, tail)
    remember(_templates, memo_key, template, _OPTIONS_MEMO_LIMIT)


def explain_program_cache_key(
    *,
    code: str | bytes,
    code_type: str,
    options: ProgramOptions | None,
    target_type: str,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | None = None,
) -> dict[str, str]:
    """The key's components as text, plus ``key``: the key's hex. Raises what the key raises.

    Two results differ in some component exactly when the two keys differ: each value is
    shown as the key sees it (keys.explain), option fields one by one (``options.<field>``),
    so ``define_macro=("N", "4")`` and ``"N=4"`` show alike and a PTX key shows the
    linker's fields only. The source and extra_digest are shown as short digests.
    """
    components = key_components(
        code=code,
        code_type=code_type,
        options=options,
        target_type=target_type,
        name_expressions=name_expressions,
        extra_digest=extra_digest,
    )
    from kernelcache.keys.explain import explain_components  # a tool's question, not a hit's

    out = explain_components(components)
    out["key"] = digest_components(components).hex()
    return out
