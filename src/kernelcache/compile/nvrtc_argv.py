"""An NVRTC command line compiled exactly as given (CuPy's ``options=(...)``).

NVRTC reads its command line left to right: ``-UFOO -DFOO=7`` leaves FOO defined as 7, the
reverse leaves it undefined; ``-diag-suppress=177 -diag-error=177`` fails, the reverse
compiles. cuda.core rebuilds the command line from ProgramOptions fields in an order of its
own, so a translation into fields alone compiles something else than the tool asked for.

``argv_options(flags)`` returns ProgramOptions whose fields are the ones the flags set (what
header tracking and the key's option policy read: include paths, pre-includes, the program
name, arch) plus ``nvrtc_argv``, the flags themselves. The compile hands NVRTC exactly
``nvrtc_argv`` (``as_bytes``), and the key hashes it in order: the policy table does not
know the field, and a field it does not know is hashed (fail closed).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from kernelcache.compile.nvrtc_flags import option_fields
from kernelcache.runners.compilers import nvrtc_argv  # noqa: F401 - the one reading of such options

__all__ = ["argv_options", "nvrtc_argv"]


@functools.cache
def _argv_class() -> type:
    from cuda.core import ProgramOptions

    @dataclasses.dataclass
    class ArgvOptions(ProgramOptions):  # type: ignore[misc]
        """ProgramOptions that NVRTC receives as ``nvrtc_argv``, verbatim and in order."""

        nvrtc_argv: tuple[str, ...] = ()

        def as_bytes(self, backend: str, target_type: str | None = None) -> list[bytes]:
            if backend.lower() != "nvrtc":
                raise ValueError(f"an NVRTC command line cannot be given to {backend}")
            flags = [flag.encode("utf-8") for flag in self.nvrtc_argv]
            if self.fdevice_time_trace is not None:
                # kernelcache's own header trace (set on a miss by the compile flow), in
                # the spelling cuda.core uses; it changes where NVRTC writes a file, not the code.
                flags.append(b"--fdevice-time-trace=" + str(self.fdevice_time_trace).encode("utf-8"))
            return flags

    ArgvOptions.__module__ = __name__
    ArgvOptions.__qualname__ = "ArgvOptions"
    return ArgvOptions


def argv_options(flags: Sequence[str]) -> Any:
    """ProgramOptions that compile exactly NVRTC ``flags``; ValueError/TypeError naming a flag
    kernelcache cannot vouch for (see nvrtc_flags: one it does not know, a value NVRTC refuses)."""
    fields = option_fields(flags)
    return _argv_class()(nvrtc_argv=tuple(flags), **fields)
