"""The program name a compile is given, which is not always ``options.name``.

cuda.core encodes ``ProgramOptions.name`` once, when the options are constructed (into
``_name``), and names the NVRTC program by those bytes: ``__FILE__``, debug info and the
directory quoted includes are searched in all follow it, and so does the name of the
ObjectCode that Program returns. A ``name`` assigned after construction changes neither
(measured with cuda.core 1.2). PTX (the linker) and NVVM input use ``options.name`` as it
is. The key, the header search and the ObjectCode a hit returns all read the name here.
"""

from __future__ import annotations

import copy
from typing import Any


def nvrtc_name(options: Any) -> bytes:
    """The bytes NVRTC is given as the program's name for a C++ compile with ``options``."""
    encoded = getattr(options, "_name", None)
    if isinstance(encoded, bytes):
        return encoded
    name = getattr(options, "name", None)
    return name.encode() if isinstance(name, str) else b"default_program"


def with_fields(options: Any, **changes: Any) -> Any:
    """A copy of ``options`` with ``changes``, compiled under the same program name.

    Not dataclasses.replace: that constructs the options anew, which encodes the current
    ``name`` again, so a compile with the copy would not be the compile of ``options``.
    """
    changed = copy.copy(options)
    for field, value in changes.items():
        setattr(changed, field, value)
    return changed


def compiled_name(options: Any, code_type: str) -> str:
    """The name of the ObjectCode cuda.core's Program returns for this compile."""
    if code_type == "c++":
        return nvrtc_name(options).decode("utf-8", "surrogateescape")
    return getattr(options, "name", None) or ""
