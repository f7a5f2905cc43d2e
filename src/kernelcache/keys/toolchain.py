"""Which compiler builds will run: identified once per process, without loading them if possible.

``nvrtcVersion()`` says "13.5" for every 13.5.x patch, and asking it means loading NVRTC
(most of the 8-11 ms that cuda.core's first cache hit costs in a fresh process). The wheels
that ship the compilers say more, for less: their distribution version is the full patch
release (nvidia-cuda-nvrtc 13.5.37), and the library file they hold is the one cuda.bindings
loads first. So each probe reads package metadata and the library file's name and size;
only when no wheel is installed (a system CUDA toolkit) does it load the library and ask.

Each probe runs once per process (functools.cache). A probe that fails returns a stable
"probe-failed:<ExceptionClass>" string: keys stay stable in a broken environment, yet never
equal the key of a working one (fail closed).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# distribution name -> file-name prefix of the shared library it ships
_WHEELS = {
    "nvrtc": ("nvidia-cuda-nvrtc", "libnvrtc.so"),
    "nvjitlink": ("nvidia-nvjitlink", "libnvJitLink.so"),
    "nvvm": ("nvidia-nvvm", "libnvvm.so"),
}


def _failed(exc: BaseException) -> str:
    return f"probe-failed:{type(exc).__name__}"


def _wheel_identity(dist_name: str, lib_prefix: str) -> str | None:
    """ "<dist>==<version>;<lib file>;<size>" for an installed wheel, or None if absent."""
    from importlib import metadata

    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return None
    lib = ""
    record = dist.read_text("RECORD")  # the rows dist.files makes, without its 1 ms of objects
    paths = [row.split(",", 1)[0] for row in record.splitlines()] if record else (dist.files or ())
    for f in paths:
        base = os.path.basename(str(f))
        if base.startswith(lib_prefix) and "builtins" not in base:
            try:
                size = os.stat(dist.locate_file(f)).st_size
            except OSError:
                size = -1
            lib = f"{base};{size}"
            break
    return f"{dist_name}=={_version(dist)};{lib}"


def _version(dist: Any) -> str:
    """The distribution's version, as ``dist.version`` gives it, for a tenth of the cost.

    ``dist.version`` runs the e-mail parser over the whole METADATA file (3 ms for
    cuda-bindings', whose long description is in it): most of a fresh process's first hit.
    The version is a header line, and headers end at the first blank line.
    """
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    for line in text.splitlines():
        if not line:
            break
        if line.startswith("Version:"):
            return line[len("Version:") :].strip()
    return str(dist.version)  # no such line: whatever the full parser makes of it


def _loaded_nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if int(err) != 0:
        raise RuntimeError(f"nvrtcVersion failed: {err}")
    return f"system-nvrtc=={major}.{minor}"


def _loaded_nvjitlink_version() -> str:
    from cuda.bindings import nvjitlink

    return f"system-nvjitlink=={nvjitlink.version()}"


def _loaded_nvvm_version() -> str:
    from cuda.bindings import nvvm

    return f"system-nvvm=={nvvm.version()};ir={nvvm.ir_version()}"


def _probe(wheel: str, fallback: Callable[[], str]) -> str:
    try:
        ident = _wheel_identity(*_WHEELS[wheel])
        return ident if ident is not None else fallback()
    except Exception as exc:  # any failure is a distinct, stable key component
        return _failed(exc)


@functools.cache
def nvrtc_identity() -> str:
    return _probe("nvrtc", _loaded_nvrtc_version)


@functools.cache
def nvjitlink_identity() -> str:
    return _probe("nvjitlink", _loaded_nvjitlink_version)


@functools.cache
def nvvm_identity() -> str:
    # libdevice (use_libdevice=True) ships in the same wheel as libNVVM, so this identity
    # also pins libdevice's content.
    return _probe("nvvm", _loaded_nvvm_version)


@functools.cache
def cuda_core_identity() -> str:
    """cuda.core and cuda.bindings turn ProgramOptions into compiler flags: pin both.

    By the version the imported package itself carries (``__version__``, written into it
    when its wheel was built): the code that runs, for free. A distribution look-up costs
    about 0.2 ms each, over half of a fresh process's first hit, and may name another
    copy than the one imported (a checkout on PYTHONPATH over an installed wheel). The
    package metadata is read only for a package without ``__version__``.
    """
    import importlib

    parts = []
    for dist, module in (("cuda-core", "cuda.core"), ("cuda-bindings", "cuda.bindings")):
        try:
            version = getattr(importlib.import_module(module), "__version__", None)
            if not isinstance(version, str) or not version:
                from importlib import metadata

                version = _version(metadata.distribution(dist))
            parts.append(f"{dist}=={version}")
        except Exception as exc:
            parts.append(f"{dist}:{_failed(exc)}")
    return ";".join(parts)


@functools.cache
def ptx_linker_identity() -> str:
    """Which linker turns PTX into cubin, and its exact version.

    cuda.core links PTX with nvJitLink when it is importable and falls back to the
    driver's cuLink otherwise; the driver's output then depends on the driver version.
    """
    ident = nvjitlink_identity()
    if not ident.startswith("probe-failed"):
        return f"nvJitLink:{ident}"
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if int(err) != 0:
            raise RuntimeError(str(err))
        return f"driver:{version}"
    except Exception as exc:
        return f"driver:{_failed(exc)}"


@dataclass(frozen=True)
class Toolchain:
    """The probe results one key derivation uses: computed once, passed down."""

    cuda_core: str
    compiler: str  # nvrtc for c++, the PTX linker for ptx, nvvm for nvvm

    def as_dict(self) -> dict[str, str]:
        return {"cuda_core": self.cuda_core, "compiler": self.compiler}


_COMPILER_PROBES: dict[str, Callable[[], str]] = {
    "c++": nvrtc_identity,
    "ptx": ptx_linker_identity,
    "nvvm": nvvm_identity,
}


@functools.cache
def toolchain_for(code_type: str) -> Toolchain:
    """The toolchain that compiles ``code_type`` (one of c++, ptx, nvvm) in this process."""
    return Toolchain(cuda_core=cuda_core_identity(), compiler=_COMPILER_PROBES[code_type]())
