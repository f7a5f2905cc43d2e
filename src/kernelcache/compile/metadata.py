"""What compile_program stores beside an artifact, and how an ObjectCode is rebuilt from it.

The artifact is stored verbatim; its metadata (a JSON-able dict) carries what a hit needs to
give back the same ObjectCode as the compile did (kind, name, symbol mapping of name
expressions, log) and what tools list (kernels, options, toolchain, headers).

The store is reached only through stores.safe (read_record/write_record/count_error): a
store that fails never fails a compile; it becomes a miss or a dropped write, one warning
per cause, and an error counted under its cause.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.compile.schema import META_SCHEMA, SCHEMA_FIELD, meta_is_usable
from kernelcache.keys.derive import code_bytes
from kernelcache.keys.program_name import compiled_name
from kernelcache.log import KernelCacheWarning, WarnOnce
from kernelcache.stores.base import Meta, ProgramCacheResource
from kernelcache.stores.safe import count_error, read_record

if TYPE_CHECKING:
    from cuda.core import ObjectCode

    from kernelcache.compile.request import CompileRequest
    from kernelcache.keys.toolchain import Toolchain


# -- metadata -----------------------------------------------------------------------------


def encode_symbols(mapping: dict[Any, Any] | None) -> list[list[str]]:
    """A symbol mapping (name expression -> mangled name, each str or bytes) as JSON-able lists."""
    out = []
    for expr, mangled in (mapping or {}).items():
        ekind, etext = ("b", expr.decode("latin-1")) if isinstance(expr, bytes) else ("s", str(expr))
        vkind, vtext = ("b", mangled.decode("latin-1")) if isinstance(mangled, bytes) else ("s", str(mangled))
        out.append([ekind, etext, vkind, vtext])
    return out


def decode_symbols(items: list[list[str]] | None) -> dict[Any, Any]:
    """The inverse of encode_symbols: str stays str, bytes stay bytes."""
    mapping: dict[Any, Any] = {}
    for ekind, etext, vkind, vtext in items or ():
        expr = etext.encode("latin-1") if ekind == "b" else etext
        mapping[expr] = vtext.encode("latin-1") if vkind == "b" else vtext
    return mapping


@functools.cache
def _factories() -> dict[str, Any]:
    from cuda.core import ObjectCode

    return {
        "cubin": ObjectCode.from_cubin,
        "ptx": ObjectCode.from_ptx,
        "ltoir": ObjectCode.from_ltoir,
    }


def object_from_record(data: bytes, target_type: str, name: str, meta: Meta) -> ObjectCode:
    """The ObjectCode a hit returns: the stored bytes with the original's symbol mapping."""
    symbols = meta.get("symbols")
    return _factories()[target_type](data, name=name, symbol_mapping=decode_symbols(symbols) if symbols else None)


# Compiled on first use (re caches it), not at import: a miss stores the kernels' names, a hit needs none.
_GLOBAL_FN = rb"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)"


def kernel_names(code: str | bytes, mapping: dict[Any, Any] | None) -> list[str]:
    """Kernel names for listings: name expressions, else __global__ functions in the source."""
    if mapping:
        return [k.decode("latin-1") if isinstance(k, bytes) else str(k) for k in mapping]
    raw = code_bytes(code)
    found = [m.decode("latin-1") for m in re.findall(_GLOBAL_FN, raw)]
    if not found:  # PTX: .entry names
        found = [m.decode("latin-1") for m in re.findall(rb"\.entry\s+(\w+)", raw)]
    return list(dict.fromkeys(found))[:32]


def options_summary(options: Any) -> dict[str, Any]:
    """The options that are set, as JSON values (for ``show``, ``ls`` and ``explain``).

    Strings, numbers and booleans as they are, bytes decoded, sequences as lists, anything
    else as its str(); cuda.core's private fields (``_name``: the encoded name) are left out.
    """
    fields = getattr(options, "__dict__", {})
    return {k: _plain(v) for k, v in fields.items() if v is not None and not k.startswith("_")}


def _plain(value: Any) -> Any:
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def artifact_meta(
    request: CompileRequest,
    obj: ObjectCode,
    log_text: str,
    seconds: float,
    toolchain: Toolchain | None,
    headers: Sequence[str],
) -> Meta:
    """The metadata stored beside a freshly compiled artifact (of schema META_SCHEMA)."""
    mapping = getattr(obj, "symbol_mapping", None)
    return {
        SCHEMA_FIELD: META_SCHEMA,
        "code_type": request.code_type,
        "target_type": request.target_type,
        "name": compiled_name(request.options, request.code_type),
        "symbols": encode_symbols(mapping),
        "log": log_text,
        "compile_seconds": seconds,
        "toolchain": toolchain.as_dict() if toolchain is not None else {},
        "options": options_summary(request.options),
        "headers": list(headers),
        "kernels": kernel_names(request.code, mapping),
    }


# -- reading an artifact, refusing to store one ------------------------------------------

_warned = WarnOnce()  # compile results returned but not stored


def read_artifact(cache: ProgramCacheResource, key: bytes) -> tuple[bytes, Meta] | None:
    """An artifact's record for a hit (the caller counts it), or None.

    A record whose metadata is of another schema or shape (schema.py) is a miss like an
    absent one: no warning, no error count, the record stays where it is.
    """
    record = read_record(cache, key, caller_counts=True)
    return record if record is not None and meta_is_usable(record[1]) else None


def refuse_to_store(cache: ProgramCacheResource, why: str) -> None:
    """One KernelCacheWarning and an error (cause ``not_stored``) for a compile returned but not stored.

    A header race warns every time (each is its own event); a lost or missing trace
    warns once per process and cause, like any other store failure.
    """
    count_error(cache, "not_stored")
    message = f"this compile's result is returned but not stored: {why}"
    if why.startswith("a header changed"):
        warnings.warn(f"kernelcache: {message}", KernelCacheWarning, 5)  # each race its own event
    else:
        _warned.warn("not stored: " + why.split(" (")[0], message, stacklevel=5, log=False)
