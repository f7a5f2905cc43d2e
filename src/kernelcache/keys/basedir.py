"""KERNELCACHE_BASE_DIR (ccache's base_dir): paths under one directory enter compile_program's keys
relative to it, so two checkouts of a project at different paths share their entries.

Only compile_program's C++ keys are rebased (its headers are tracked by content and by their
place on the search path, relative to it: a header reached through the base directory is
checked like any other, never a stale hit), and only ``include_path``, ``pre_include`` and
``name`` entries that are absolute paths under the base directory. A rebased path enters the
key marked as rebased, so it never equals a relative path given as such.

A compile whose output names the base directory (``__FILE__`` in an ``assert``, ``-lineinfo``,
``-G``) is not the same in another checkout: such a result is returned and not stored. LTO-IR
is left as it is (its strings are not byte-aligned in the bitcode, so that check cannot be made).
"""

from __future__ import annotations

import os
from typing import Any

from kernelcache import config
from kernelcache.keys.program_name import compiled_name, with_fields
from kernelcache.memo import remember

FIELDS = ("include_path", "pre_include", "name")
REBASED_TARGETS = ("cubin", "ptx")
# No path holds a NUL byte: a rebased value can never equal one a caller gave.
_MARK = "\0base_dir\0"
_checked: dict[str, str] = {}  # raw value -> the validated base directory


def current() -> str | None:
    """The base directory (config.base_dir), read per call at the cost of one dict look-up."""
    text = config.env_get("KERNELCACHE_BASE_DIR")  # the config file loaded first: it may set it
    if not text:
        return None
    base = _checked.get(text)
    if base is None:
        base = config.base_dir()  # ConfigError for a bad value, at once
        if base is None:
            return None
        remember(_checked, text, base, 64)
    return base


def _rebase(value: Any, base: str) -> Any:
    if isinstance(value, str):
        if os.path.isabs(value):
            path = os.path.normpath(value)
            if path.startswith(base + os.sep):
                return _MARK + os.path.relpath(path, base)
        return value
    if isinstance(value, (list, tuple)):
        items = [_rebase(v, base) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
    return value


def key_options(options: Any, code_type: str, target_type: str, base: str | None) -> Any:
    """The options compile_program's key is made of: ``options`` itself, or a copy whose paths
    under ``base`` are rebased (C++ to cubin or PTX only)."""
    if base is None or code_type != "c++" or target_type not in REBASED_TARGETS:
        return options
    changed = {}
    for field in FIELDS:
        # The name NVRTC is given (cuda.core's encoded one), not a name assigned later.
        value = compiled_name(options, code_type) if field == "name" else getattr(options, field, None)
        new = _rebase(value, base)
        if new is not value:
            changed[field] = new
    if not changed:
        return options
    if "name" in changed:
        changed["_name"] = changed["name"].encode("utf-8", "surrogateescape")  # what the key reads
    return with_fields(options, **changed)  # a copy for the key: the caller's options stay as they are


def names_base(data: bytes, base: str) -> bool:
    """Whether an artifact holds the base directory's path: as bytes (cubin), or as PTX writes a
    string constant (its bytes in decimal, ``{47, 104, ...}``)."""
    raw = os.fsencode(base)
    return raw in data or ", ".join(str(b) for b in raw).encode() in data


def unshareable(options: Any, code_type: str, target_type: str, data: bytes) -> str:
    """Why a compile's result may not be stored under its rebased key ("" when it may)."""
    base = current()
    if base is None or key_options(options, code_type, target_type, base) is options:
        return ""
    if names_base(data, base):
        return (
            f"it names the KERNELCACHE_BASE_DIR {base} (__FILE__, -lineinfo or -G), so it differs between "
            "checkouts and cannot be shared under a key relative to that directory"
        )
    return ""
