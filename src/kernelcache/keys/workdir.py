"""When the working directory enters compile_program's key: exactly when the output can name it.

Measured with NVRTC 13.5: ``__FILE__`` and ``assert`` spell a path as it was written (the program
name, or a header's name as its includer spelled it, joined to the directory it was found in),
so they never hold the working directory unless a path given already did. The line table of
``-lineinfo`` and ``-G`` names files and directories by absolute paths: a relative program
name (on NVRTC directly: a verbatim command line), a header found through a relative
``include_path`` entry (or through the main source's directory when the program name is
relative) is written joined to the working directory, and ``-G`` writes the working directory
itself. (cuda.core's Program compiles such requests under a temporary file's name of its own,
random per compile: their output differs between two plain compiles anyway.) So the working
directory is part of a C++ key when line info is emitted and the program name or an
``include_path`` entry is relative, and not otherwise: two directories with the same headers
share their entries when nothing in the output names either (the header variant still checks
each directory's own files, headers.variants).
"""

from __future__ import annotations

import os
from typing import Any

from kernelcache.keys.options import as_list
from kernelcache.keys.program_name import compiled_name
from kernelcache.memo import remember

# The NVRTC flags that emit a line table (as ProgramOptions spells them, and as a verbatim
# command line may: CuPy's).
LINE_TABLE_FLAGS = frozenset({b"-lineinfo", b"--generate-line-info", b"-G", b"--device-debug"})

_memo: dict[Any, bool] = {}


def names_workdir(options: Any, code_type: str, fingerprint: Any = None) -> bool:
    """Whether a compile with ``options`` can write the working directory into its output.

    ``fingerprint``: keys.options.options_fingerprint(options), to memoise the answer by.
    """
    if code_type != "c++":
        return False  # PTX and NVVM input name no file of the working directory
    if fingerprint is not None:
        known = _memo.get(fingerprint)
        if known is not None:
            return known
    try:
        flags = {f.split(b"=", 1)[0] if isinstance(f, bytes) else str(f).encode() for f in options.as_bytes("nvrtc")}
    except Exception:
        flags = set()
    relative = not os.path.isabs(compiled_name(options, code_type)) or any(
        not os.path.isabs(d) for d in as_list(getattr(options, "include_path", None))
    )
    answer = relative and bool(flags & LINE_TABLE_FLAGS)
    if fingerprint is not None:
        try:
            remember(_memo, fingerprint, answer, 1024)
        except TypeError:
            pass
    return answer


def key_component(options: Any, code_type: str, fingerprint: Any = None) -> list[tuple[str, bytes]]:
    """The key component for the working directory: [("cwd", path)] when the output can name
    it (names_workdir), else []. A deleted working directory: a component no live one equals."""
    if not names_workdir(options, code_type, fingerprint):
        return []
    try:
        return [("cwd", os.fsencode(os.getcwd()))]
    except FileNotFoundError:
        return [("cwd", b"\0deleted")]
