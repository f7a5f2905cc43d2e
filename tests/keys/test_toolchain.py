"""The toolchain's identity parts read the same facts as the tools made for them: cuda.core's and
cuda.bindings' versions as their metadata says, the library file cuda.pathfinder loads."""

from __future__ import annotations

import json
from importlib import metadata

import pytest
from helpers import run_python

from kernelcache.keys import toolchain


def test_cuda_core_identity_from_the_imported_packages_equals_their_metadata() -> None:
    # The identity reads the imported packages' __version__ (no distribution look-up); on
    # an installed wheel it is exactly what the metadata says.
    expected = ";".join(f"{d}=={metadata.version(d)}" for d in ("cuda-core", "cuda-bindings"))
    assert toolchain.cuda_core_identity() == expected


PATHFINDER = """
import json
from kernelcache.keys import toolchain
found = {lib: toolchain.library_file(lib) for lib in ("nvrtc", "nvJitLink", "nvvm")}
from cuda.pathfinder import load_nvidia_dynamic_lib
loaded = {lib: load_nvidia_dynamic_lib(lib).abs_path for lib in found}
print(json.dumps({"found": found, "loaded": loaded, "after": {lib: toolchain.loaded_file(lib) for lib in found}}))
"""


def test_the_file_found_without_loading_is_the_one_cuda_pathfinder_loads() -> None:
    got = json.loads(run_python(PATHFINDER).strip().splitlines()[-1])
    if not any(got["found"].values()):
        pytest.skip("no compiler wheel here: only the system's loader finds them (the key loads them then)")
    for lib, found in got["found"].items():
        if found is not None:
            path, how = found
            assert how in ("site-packages", "conda") and path == got["loaded"][lib] == got["after"][lib]


def test_the_build_id_is_read_from_the_elf_notes(tmp_path) -> None:
    path, _ = toolchain.library_file("nvrtc", load=True)
    name, size, build = toolchain.file_identity(path).split(";")
    assert len(bytes.fromhex(build)) == 20
    # The same bytes elsewhere (a copy on another machine): the same identity, path aside.
    copy = tmp_path / name
    with open(path, "rb") as src, open(copy, "wb") as dst:
        while block := src.read(1 << 22):
            dst.write(block)
    assert toolchain.file_identity(str(copy)) == f"{name};{size};{build}"
    # A file with no build id is named by its content.
    plain = tmp_path / "libnvrtc.so.13"
    plain.write_bytes(b"not an ELF file")
    assert toolchain.file_identity(str(plain)).startswith("libnvrtc.so.13;15;sha256:")
