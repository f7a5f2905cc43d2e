"""Which compiler library file compiles (NVRTC, nvJitLink, NVVM), and the identity keys record for it.

One answer for the key, the compiler workers, ``kernelcache config`` and ``explain``:
``library_file(lib)`` is the file that cuda.bindings runs in this process, found in
cuda.pathfinder's own order, and ``library_identity(lib)`` names its build:
1. a library already loaded in this process (by anyone) wins: dlopen(RTLD_NOLOAD) of its sonames;
2. else the file on disk: the NVIDIA wheels' folders in every site-packages folder, then
   $CONDA_PREFIX; found with a few stats, nothing loaded (a fresh process's first hit);
3. else the system's loader would search (a CUDA toolkit through ld.so.conf or
   LD_LIBRARY_PATH): only loading it says which file that is, so then it is loaded.
A guess of step 2 that cuda.pathfinder does not make (a version of it that searches elsewhere)
is caught once the library is loaded: ``confirm`` names the file that did compile, and a compile
whose key named another build is not stored.

The identity is the file's name, size and ELF build id (NT_GNU_BUILD_ID, from its PT_NOTE
segment): one open and a few reads, the same on every machine that has that build (a team
cache, Redis and bundles are shared between machines: no paths or mtimes). A file without a
build id is identified by its SHA-256. Each identity is computed once per process; a probe that
fails gives a stable "probe-failed:<ExceptionClass>" (keys stay stable in a broken environment
and never equal a working one's).
"""

from __future__ import annotations

import _ctypes
import ctypes
import functools
import hashlib
import os
import struct
import threading
from typing import NamedTuple

from kernelcache.regular_file import open_regular

__all__ = ["LIBRARIES", "Toolchain", "confirm", "file_identity", "library_file", "library_identity"]

# lib -> (sonames, folders inside site-packages, folders inside $CONDA_PREFIX): cuda.pathfinder's
# descriptors for Linux, in its order.
LIBRARIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "nvrtc": (("libnvrtc.so.13", "libnvrtc.so.12"), ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"), ("lib64", "lib")),
    "nvJitLink": (
        ("libnvJitLink.so.13", "libnvJitLink.so.12"),
        ("nvidia/cu13/lib", "nvidia/nvjitlink/lib"),
        ("lib64", "lib"),
    ),
    "nvvm": (("libnvvm.so.4", "libnvvm.so"), ("nvidia/cu13/lib", "nvidia/cuda_nvcc/nvvm/lib64"), ("nvvm/lib64",)),
}
_RTLD_DI_LINKMAP = 2


class _LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]  # the head of glibc's struct link_map


def loaded_file(lib: str) -> str | None:
    """The file of ``lib`` loaded in this process now (by anyone), or None: as cuda.pathfinder
    asks, dlopen(soname, RTLD_NOLOAD) of each soname in turn. Where none is loaded that is the
    loader's whole search for each (about 25 failed opens of its hwcaps folders: ~75 us each
    here, the first call of a process more; cheaper than a walk of all loaded objects in a
    large process, and the loader's own answer, sonames included)."""
    for soname in LIBRARIES[lib][0]:
        try:
            # _ctypes.dlopen is ctypes' own dlopen (what CDLL calls): OSError where it returns
            # NULL, so the usual answer (not loaded) builds no function objects at all.
            handle = _ctypes.dlopen(soname, os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        dl = _dl()
        try:
            node = ctypes.POINTER(_LinkMap)()
            if dl.dlinfo(handle, _RTLD_DI_LINKMAP, ctypes.byref(node)) == 0 and node.contents.l_name:
                return os.fsdecode(node.contents.l_name)
        finally:
            _ctypes.dlclose(handle)  # the reference this dlopen took; the library stays loaded by its loader
    return None


@functools.cache
def _dl() -> ctypes.CDLL:
    """dlinfo with its C signature (glibc 2.34+: in libc; before, in libdl)."""
    try:
        dl = ctypes.CDLL(None)
        dl.dlinfo  # noqa: B018 - is it there
    except AttributeError:
        dl = ctypes.CDLL("libdl.so.2")
    dl.dlinfo.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    return dl


@functools.cache
def _site_dirs() -> list[str]:
    """The site-packages folders cuda.pathfinder searches, in its order (a venv's first, then the
    user's, then the system's)."""
    import site
    import sys

    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        dirs.insert(1 if sys.prefix != sys.base_prefix else 0, site.getusersitepackages())
    return dirs


def on_disk(lib: str) -> tuple[str, str] | None:
    """(path, "site-packages" or "conda") of the file cuda.pathfinder finds for ``lib`` without
    loading anything, or None where only the system's search could find one."""
    sonames, wheel_dirs, conda_dirs = LIBRARIES[lib]
    places = [("site-packages", [os.path.join(s, rel) for rel in wheel_dirs for s in _site_dirs()])]
    conda = os.environ.get("CONDA_PREFIX")
    if conda:
        places.append(("conda", [os.path.join(conda, rel) for rel in conda_dirs]))
    for how, folders in places:
        for folder in folders:
            for soname in sonames:
                path = os.path.join(folder, soname)
                if os.path.isfile(path):
                    return path, how
    return None


def _load(lib: str) -> None:
    """Load ``lib`` as a compile would: through cuda.bindings (cuda.pathfinder's search)."""
    if lib == "nvrtc":
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    elif lib == "nvJitLink":
        from cuda.bindings import nvjitlink

        nvjitlink.version()
    else:
        from cuda.bindings import nvvm

        nvvm.version()


def library_file(lib: str, load: bool = False) -> tuple[str, str] | None:
    """(path, how it was found: "loaded", "site-packages", "conda", "system") of the file that
    compiles ``lib`` in this process; None where none is loaded or on disk and ``load`` is False.
    ``load=True`` loads it (as a compile would) unless it is loaded already; errors propagate."""
    path = loaded_file(lib)
    if path is not None:
        return path, "loaded"
    found = on_disk(lib)
    if found is not None and not load:
        return found
    if found is None and not load:
        return None
    _load(lib)
    path = loaded_file(lib)
    if path is None:
        raise OSError(f"{lib} was loaded, yet none of {LIBRARIES[lib][0]} is mapped in this process")
    return path, "loaded" if found is not None else "system"


def file_identity(path: str) -> str:
    """"<file name>;<size>;<build id>" of a library file (its SHA-256 where it has no build id)."""
    fd, st = open_regular(path, follow=True)  # os.pread: no buffered file object for a few small reads
    try:
        build = _build_id(fd)
        if build is None:
            digest = hashlib.sha256()
            offset = 0
            while block := os.pread(fd, 1 << 20, offset):
                digest.update(block)
                offset += len(block)
            build = "sha256:" + digest.hexdigest()
    finally:
        os.close(fd)
    name = os.path.basename(os.path.realpath(path) if os.path.islink(path) else path)
    return f"{name};{st.st_size};{build}"


def _build_id(fd: int) -> str | None:
    """The NT_GNU_BUILD_ID of a 64-bit little-endian ELF file, read from its PT_NOTE segments."""
    head = os.pread(fd, 64, 0)
    if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
        return None
    phoff, = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    table = os.pread(fd, phentsize * phnum, phoff)
    for at in range(0, len(table) - 55, phentsize):
        p_type, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", table, at)
        if p_type != 4:  # PT_NOTE
            continue
        notes, pos = os.pread(fd, min(filesz, 1 << 16), offset), 0
        while pos + 12 <= len(notes):
            namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
            desc = pos + 12 + (namesz + 3) // 4 * 4
            if kind == 3 and notes[pos + 12 : pos + 12 + namesz] == b"GNU\0":
                return notes[desc : desc + descsz].hex()
            pos = desc + (descsz + 3) // 4 * 4
    return None


_identities: dict[str, str] = {}  # lib -> its identity in this process (what keys record)
_confirmed: dict[str, str] = {}  # lib -> the file loaded here, once confirm saw it
_lock = threading.Lock()


def library_identity(lib: str) -> str:
    """The identity of the file that compiles ``lib`` here (library_file, loading it only where
    nothing else can say which), computed once per process; "probe-failed:<Exception>" if none."""
    ident = _identities.get(lib)
    if ident is None:
        try:
            found = library_file(lib) or library_file(lib, load=True)
            assert found is not None
            ident = file_identity(found[0])
        except Exception as exc:  # any failure is a distinct, stable key component
            ident = f"probe-failed:{type(exc).__name__}"
        with _lock:
            ident = _identities.setdefault(lib, ident)
    return ident


def confirm(code_type: str, recorded: str) -> str:
    """After a compile of ``code_type`` ran in this process or one it started: "" when the key's
    compiler identity ``recorded`` is that of the library loaded here, else why not (this
    process's later keys then name the loaded file). A worker proves its own file (runners)."""
    lib = COMPILER_LIBRARY[code_type]
    if lib not in _confirmed:  # a library once loaded stays loaded: looked up once
        path = loaded_file(lib)
        if path is None:
            return ""  # not loaded here: the PTX linker was the driver's, say
        try:
            now = file_identity(path)
        except OSError:
            return ""  # a file deleted since it was loaded: its identity was taken before (library_identity)
        with _lock:
            changed = _identities.get(lib) != now
            _identities[lib] = now
            _confirmed[lib] = path
        if changed:
            toolchain_for.cache_clear()
    path = _confirmed[lib]
    current = _COMPILER_PROBES[code_type]()
    if current == recorded:
        return ""
    return f"its key named the compiler {recorded}, but {path} ({current}) compiled it"


def nvrtc_identity() -> str:
    return library_identity("nvrtc")


def nvvm_identity() -> str:
    """NVVM's identity; ";wheel" where it comes from a wheel, which ships libdevice with it
    (use_libdevice=True is then pinned by this identity, keys.derive)."""
    ident = library_identity("nvvm")
    found = library_file("nvvm")
    return ident + (";wheel" if found and _in_site_packages(found[0]) else "")


def _in_site_packages(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(os.path.realpath(d) + os.sep) for d in _site_dirs())


@functools.cache
def cuda_core_identity() -> str:
    """cuda.core and cuda.bindings turn ProgramOptions into compiler flags: pin both, by the
    version the imported package itself carries (``__version__``, written into it when its wheel
    was built): the code that runs, with no distribution look-up."""
    import importlib

    parts = []
    for dist, module in (("cuda-core", "cuda.core"), ("cuda-bindings", "cuda.bindings")):
        try:
            version = getattr(importlib.import_module(module), "__version__", None)
            if not isinstance(version, str) or not version:
                from importlib import metadata

                version = metadata.version(dist)
            parts.append(f"{dist}=={version}")
        except Exception as exc:
            parts.append(f"{dist}:probe-failed:{type(exc).__name__}")
    return ";".join(parts)


def ptx_linker_identity() -> str:
    """Which linker turns PTX into cubin, and its build: cuda.core links PTX with nvJitLink where
    it can be loaded and with the driver's cuLink otherwise (whose output follows the driver)."""
    ident = library_identity("nvJitLink")
    if not ident.startswith("probe-failed"):
        return f"nvJitLink:{ident}"
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if int(err) != 0:
            raise RuntimeError(str(err))
        return f"driver:{version}"
    except Exception as exc:
        return f"driver:probe-failed:{type(exc).__name__}"


class Toolchain(NamedTuple):
    """The probe results one key derivation uses: computed once, passed down. (A NamedTuple: a
    frozen dataclass costs every import half a millisecond to make.)"""

    cuda_core: str
    compiler: str  # nvrtc for c++, the PTX linker for ptx, nvvm for nvvm

    def as_dict(self) -> dict[str, str]:
        return {"cuda_core": self.cuda_core, "compiler": self.compiler}


_COMPILER_PROBES = {"c++": nvrtc_identity, "ptx": ptx_linker_identity, "nvvm": nvvm_identity}
COMPILER_LIBRARY = {"c++": "nvrtc", "ptx": "nvJitLink", "nvvm": "nvvm"}  # the library each code_type runs


@functools.cache
def toolchain_for(code_type: str) -> Toolchain:
    """The toolchain that compiles ``code_type`` (one of c++, ptx, nvvm) in this process."""
    return Toolchain(cuda_core=cuda_core_identity(), compiler=_COMPILER_PROBES[code_type]())
