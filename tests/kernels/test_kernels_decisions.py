"""KernelCache's decisions that need no GPU, tested on CPU with real objects: which requests
share an L1 entry, which driver errors heal a cached entry, which mean a wrong kernel name.

The driver errors are cuda.core's own exception, with the text cuda.core gives it (the
error's name and cuda.core's explanation of it), as a load raises them on a GPU.
"""

from __future__ import annotations

import pytest
from cuda.bindings import driver
from cuda.core import ProgramOptions
from helpers import ARCH

from kernelcache import compile_program
from kernelcache.kernels.cache import l1_key
from kernelcache.kernels.loader import driver_error, heals, no_such_kernel

cuda_utils = pytest.importorskip("cuda.core._utils.cuda_utils")

SOURCE = "template <typename T> __global__ void scale(T* x) { x[threadIdx.x] *= 2; }"


def load_error(name: str) -> Exception:
    """The exception cuda.core raises for the driver's CUresult ``name``."""
    code = int(getattr(driver.CUresult, name))
    explanation = cuda_utils.DRIVER_CU_RESULT_EXPLANATIONS.get(code)
    return cuda_utils.CUDAError(f"{name}: {explanation}" if explanation else name)


def key(options: object, **changes: object) -> object:
    args = {"code": SOURCE, "name": "scale", "code_type": "c++", "target_type": "cubin", "names": ()}
    args.update({"extra_digest": None, "options": options}, **changes)
    return l1_key(**args)  # type: ignore[arg-type]


# -- L1 keys ------------------------------------------------------------------------------------


def test_equal_options_share_an_l1_entry_and_a_mutated_one_does_not() -> None:
    options = ProgramOptions(arch=ARCH)
    first = key(options)
    assert key(ProgramOptions(arch=ARCH)) == first  # by value, not by object
    options.arch = "sm_80"  # mutated after its first use: another program
    assert key(options) != first
    assert key(ProgramOptions(arch=ARCH, use_fast_math=True)) != first


def test_list_valued_options_are_keyed_by_their_contents() -> None:
    a = key(ProgramOptions(arch=ARCH, include_path=["/inc/a"]))
    hash(a)  # usable as a key although the options hold a list
    assert key(ProgramOptions(arch=ARCH, include_path=["/inc/a"])) == a
    assert key(ProgramOptions(arch=ARCH, include_path=["/inc/b"])) != a


@pytest.mark.parametrize(
    "change",
    [
        {"code": SOURCE + " "},
        {"name": "other"},
        {"code_type": "ptx"},
        {"target_type": "ptx"},
        {"names": ("scale<float>",)},
        {"extra_digest": b"headers"},
    ],
)
def test_every_request_field_is_part_of_the_l1_key(change: dict) -> None:
    options = ProgramOptions(arch=ARCH)
    assert key(options, **change) != key(options)


# -- what driver errors heal --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_INVALID_SOURCE"])
def test_bad_bytes_from_the_cache_heal_and_from_a_fresh_compile_do_not(name: str) -> None:
    exc = load_error(name)
    assert driver_error(exc) == name
    options = ProgramOptions(arch="sm_90")
    assert heals(exc, hit=True, options=options, compute_capability=(9, 0))
    assert not heals(exc, hit=False, options=options, compute_capability=(9, 0))  # recompiling gives the same


@pytest.mark.parametrize(
    ("arch", "capability", "heal"),
    [
        ("sm_90", (9, 0), True),  # the key says this GPU, the image does not: bad bytes
        ("sm_90a", (9, 0), True),
        ("sm_80", (9, 0), False),  # compiled for another GPU: the caller's choice
        ("sm_100", (10, 0), True),
        ("sm_100", (9, 0), False),
    ],
)
def test_no_binary_for_this_gpu_heals_only_when_the_options_target_it(arch: str, capability, heal: bool) -> None:
    exc = load_error("CUDA_ERROR_NO_BINARY_FOR_GPU")
    assert heals(exc, hit=True, options=ProgramOptions(arch=arch), compute_capability=capability) is heal


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",  # this machine's driver is too old: the entry is good
        "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUDA_ERROR_NOT_FOUND",  # a wrong kernel name: the caller's mistake
    ],
)
def test_errors_of_this_machine_or_the_caller_keep_the_entry(name: str) -> None:
    exc = load_error(name)
    assert not heals(exc, hit=True, options=ProgramOptions(arch="sm_90"), compute_capability=(9, 0))


def test_an_error_without_a_driver_code_never_heals() -> None:
    exc = MemoryError("out of host memory")
    assert driver_error(exc) is None
    assert not heals(exc, hit=True, options=ProgramOptions(arch="sm_90"), compute_capability=(9, 0))


# -- a wrong kernel name -------------------------------------------------------------------------


def test_a_missing_kernel_is_a_value_error_naming_the_programs_kernels(tmp_path) -> None:
    from kernelcache import FileStreamProgramCache

    obj = compile_program(
        SOURCE,
        options=ProgramOptions(arch=ARCH),
        name_expressions=("scale<float>", "scale<double>"),
        cache=FileStreamProgramCache(tmp_path),
    )
    mistake = no_such_kernel(load_error("CUDA_ERROR_NOT_FOUND"), "scal", SOURCE, obj.symbol_mapping)
    assert isinstance(mistake, ValueError)
    assert "'scal'" in str(mistake) and "scale<float>" in str(mistake) and "scale<double>" in str(mistake)
    for other in ("CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_OUT_OF_MEMORY"):
        assert no_such_kernel(load_error(other), "scal", SOURCE, obj.symbol_mapping) is None
