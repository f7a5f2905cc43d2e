"""The toolchain probe's shortcuts give exactly what importlib.metadata's full parsers give."""

from __future__ import annotations

import os
from importlib import metadata

import pytest

from kernelcache.keys import toolchain


@pytest.mark.parametrize("dist_name", ["cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc", "nvidia-nvjitlink"])
def test_version_header_equals_the_full_parse(dist_name: str) -> None:
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        pytest.skip(f"{dist_name} is not installed here")
    assert toolchain._version(dist) == dist.version


def test_library_row_equals_dist_files() -> None:
    dist_name, prefix = toolchain._WHEELS["nvrtc"]
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        pytest.skip("no NVRTC wheel here")
    lib = next(str(f) for f in dist.files or () if os.path.basename(str(f)).startswith(prefix))
    size = os.stat(dist.locate_file(lib)).st_size
    expected = f"{dist_name}=={dist.version};{os.path.basename(lib)};{size}"
    assert toolchain._wheel_identity(dist_name, prefix) == expected


def test_cuda_core_identity_from_the_imported_packages_equals_their_metadata() -> None:
    # The identity reads the imported packages' __version__ (no distribution look-up); on
    # an installed wheel it is exactly what the metadata says, so keys did not change.
    expected = ";".join(f"{d}=={metadata.version(d)}" for d in ("cuda-core", "cuda-bindings"))
    assert toolchain.cuda_core_identity() == expected
