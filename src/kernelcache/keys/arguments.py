"""ProgramOptions values no compile should be given, refused before a key is made.

Where cuda.core refuses a value itself (``define_macro=123``: its option formatting raises),
the key raises exactly what cuda.core raises, in its words: a key for options that cannot
compile would be a key for nothing. Where cuda.core passes a value on in silence as
something else, one clear TypeError: an ``include_path``/``pre_include`` that is not a str
or a list/tuple of str or path-like objects (cuda.core gives NVRTC nothing for ``5``, a
``pathlib.Path`` or a set, and one flag per byte for ``b"inc"``).
"""

from __future__ import annotations

import os
from typing import Any

_PATH_FIELDS = ("include_path", "pre_include")


def check_path_fields(options: Any) -> None:
    """TypeError for an include_path or pre_include cuda.core would not pass on as written."""
    for field in _PATH_FIELDS:
        value = getattr(options, field, None)
        if value is None or isinstance(value, str):
            continue
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, os.PathLike)) for v in value):
            continue
        raise TypeError(
            f"ProgramOptions.{field} must be a str or a list or tuple of str or path-like objects, not "
            f"{value!r} ({type(value).__name__}): cuda.core would not pass it to NVRTC as written; "
            f"e.g. {field}=[str(path)]"
        )


def check_as_cuda_core(options: Any, target_type: str) -> None:
    """What cuda.core refuses in C++ options (its option formatting raises), raised as it raises it."""
    as_bytes = getattr(options, "as_bytes", None)
    if as_bytes is not None:
        as_bytes("nvrtc", target_type)  # cuda.core's own refusals, raised as it raises them
