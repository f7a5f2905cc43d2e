"""The real-kernel corpus: NVRTC kernels nobody on the project wrote (LICENSES.md), as requests.

``kernels.json`` lists each request: its source file, name expressions, include directories
(``{bundled}``: NVRTC's bundled CUDA Toolkit and CCCL headers, installed from the NVRTC library
at run time by ``bundled_headers``: nothing is fetched), ``-std``, and optionally arch and program
name. 171 CuPy kernels (cupyx's RawModule sources, one template instantiation per request: about
70 headers each through CuPy's complex.cuh, Thrust and libcu++) and 12 "deep" ones (CCCL's CUB
NVRTC test kernel at 6 archs x 2 standards: about 716 headers each). Used by
benchmarks/bench_real_kernels.py and tests/compile/test_real_kernels.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

KERNELS = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One request of the corpus: compile ``code`` with ``ProgramOptions(**options)``."""

    name: str  # a short label: source file and name expression
    code: str
    options: dict[str, Any]
    name_expressions: tuple[str, ...]
    deep: bool  # the CUB kernel (hundreds of headers)


# A CUDA toolkit's include directory to use instead of NVRTC's bundled headers (the same layout:
# the toolkit's headers, CCCL's under cccl/), for an NVRTC without nvrtcInstallBundledHeaders.
HEADERS_ENV = "CORPUS_TOOLKIT_INCLUDE"


def bundled_headers(where: str) -> str:
    """NVRTC's bundled headers installed under ``where`` (kept there: later calls reuse them), or
    the toolkit include directory $CORPUS_TOOLKIT_INCLUDE names; RuntimeError when this NVRTC has
    no bundled headers (before 13.x's nvrtcInstallBundledHeaders) and none is named."""
    given = os.environ.get(HEADERS_ENV)
    if given:
        if not os.path.isdir(os.path.join(given, "cccl")):
            raise RuntimeError(f"${HEADERS_ENV}={given!r} has no cccl/ (a CUDA 13 toolkit's include directory has)")
        return given
    from cuda.bindings import nvrtc

    marker = os.path.join(where, ".nvrtc_headers_version")
    if not os.path.exists(marker):
        install = getattr(nvrtc, "nvrtcInstallBundledHeaders", None)
        if install is None:
            raise RuntimeError("this NVRTC bundles no headers (nvrtcInstallBundledHeaders is missing)")
        err = install(os.fsencode(where), 0)[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"nvrtcInstallBundledHeaders({where!r}) failed: {err!r}")
    return where


def kernels(bundled: str, arch: str = "sm_90", deep: bool | None = None) -> list[Kernel]:
    """The corpus's requests (``deep``: only the deep ones, True, or only the others, False)."""
    with open(os.path.join(KERNELS, "kernels.json")) as f:
        entries = json.load(f)
    out = []
    for entry in entries:
        if deep is not None and bool(entry.get("deep")) != deep:
            continue
        with open(os.path.join(KERNELS, entry["source"])) as f:
            code = f.read()
        include = [
            d.replace("{bundled}", bundled) if "{bundled}" in d else os.path.join(KERNELS, d) for d in entry["include"]
        ]
        options: dict[str, Any] = {"arch": entry.get("arch", arch), "std": entry["std"], "include_path": include}
        if "name" in entry:
            options["name"] = entry["name"]
        names = tuple(entry["name_expressions"])
        label = (
            os.path.basename(entry["source"]) + (f" {names[0]}" if names else "") + f" {options['arch']} {entry['std']}"
        )
        out.append(Kernel(label, code, options, names, bool(entry.get("deep"))))
    return out


# NVRTC names internal-linkage symbols (an anonymous namespace's, a static's) with a random id per
# compile (measured with 13.5: _INTERNAL_00000000_4_k_cu_<8 hex>_...), so two plain compiles of
# such a source differ in those bytes and nowhere else. Equal after this, and only this, rewrite.
_INTERNAL_ID = re.compile(rb"(_INTERNAL_[0-9a-f]{8}_\d+_\w+?_)[0-9a-f]{8}_")


def same_code(ours: bytes, plain: bytes) -> bool:
    """Whether ``ours`` is what the plain compile gave, byte for byte but for NVRTC's random
    internal-linkage ids (which two plain compiles do not share either)."""
    if ours == plain:
        return True
    return len(ours) == len(plain) and _INTERNAL_ID.sub(rb"\1_", ours) == _INTERNAL_ID.sub(rb"\1_", plain)


def plain_compile(kernel: Kernel, target_type: str = "cubin") -> bytes:
    """The kernel through cuda.core's Program, as a user without kernelcache compiles it."""
    from cuda.core import Program, ProgramOptions

    program = Program(kernel.code, "c++", options=ProgramOptions(**kernel.options))
    try:
        return bytes(program.compile(target_type, name_expressions=kernel.name_expressions).code)
    finally:
        program.close()
