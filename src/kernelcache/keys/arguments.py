"""ProgramOptions values no compile should be given, refused before a key is made.

Where cuda.core refuses a value itself (``define_macro=123``: its option formatting raises),
the key raises exactly what cuda.core raises, in its words: a key for options that cannot
compile would be a key for nothing. Where cuda.core passes a value on in silence as
something else, one clear TypeError: an ``include_path``/``pre_include`` that names
something cuda.core drops or mangles. cuda.core passes a str as one flag and each item of a
sequence as one; anything else it drops in silence (``5``, a ``pathlib.Path``, a set), and
bytes become one flag per byte. Falsy values it drops (``False``) name nothing: accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_PATH_FIELDS = ("include_path", "pre_include")


def check_path_fields(options: Any) -> None:
    """TypeError for an include_path or pre_include cuda.core would not pass on as written."""
    for field in _PATH_FIELDS:
        value = getattr(options, field, None)
        mangled = isinstance(value, (bytes, bytearray))
        if value is None or isinstance(value, str) or not value or (isinstance(value, Sequence) and not mangled):
            continue
        what = "one flag per byte" if mangled else "nothing"
        raise TypeError(
            f"ProgramOptions.{field} must be a str or a list or tuple of str or path-like objects, not "
            f"{value!r} ({type(value).__name__}): cuda.core would pass {what} to NVRTC for it; "
            f"e.g. {field}=[str(path)]"
        )


def check_as_cuda_core(options: Any, code_type: str, target_type: str) -> None:
    """What cuda.core refuses in C++ or NVVM options, raised as it raises it.

    Its option formatting for the backend raises (a malformed macro for NVRTC; for NVVM every
    NVRTC-only field: std, lineinfo, use_fast_math, define_macro, ...), and so do its key and
    its compile, which both format the options first. The PTX linker formats no such list.
    """
    as_bytes = getattr(options, "as_bytes", None)
    if as_bytes is not None:
        as_bytes("nvrtc" if code_type == "c++" else "nvvm", target_type)
