"""KernelCache loading on real GPUs: get_kernels, a wrong kernel name, a driver that cannot load
a good entry, and the caller's current context."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from gpu_kernels import SRC, _scale_on
from test_gpu_kernels import _devices, _options

from kernelcache import CompileInfo, CompileManyError, FileStreamProgramCache, KernelCache, KernelCacheWarning

pytestmark = pytest.mark.gpu

TWICE = SRC.replace("void scale(", "void scale_twice(").replace("x[i] *= a", "x[i] *= 2.0f * a")
TEMPLATE = r"""
template <typename T>
__global__ void tscale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""


def _current_context() -> int:
    from cuda.bindings import driver

    err, ctx = driver.cuCtxGetCurrent()
    assert err == driver.CUresult.CUDA_SUCCESS
    return int(ctx or 0)


def test_get_kernels_loads_and_launches(tmp_path) -> None:
    store = FileStreamProgramCache(tmp_path)
    kc = KernelCache(store)
    requests = [
        {"code": SRC, "name": "scale", "options": _options(0)},
        {"code": TWICE, "name": "scale_twice"},  # options from the device
        {"code": TEMPLATE, "name": "tscale<float>", "name_expressions": ["tscale<float>"], "options": _options(0)},
    ]
    kernels = kc.get_kernels(requests, device=0)
    expected = [3.0, 6.0, 3.0]
    for kernel, factor in zip(kernels, expected):
        np.testing.assert_allclose(_scale_on(0, kernel), factor * np.arange(512))
    assert store.stats()["compiles"] == 3
    assert kc.get_kernels(requests, device=0) == kernels  # L1: the same objects
    assert kc.get_kernel(SRC, "scale", options=_options(0), device=0) is kernels[0]  # one L1 for both calls
    again = KernelCache(store).get_kernels(requests, device=0)  # a fresh L1: L2 hits, no compile
    np.testing.assert_allclose(_scale_on(0, again[1]), 6.0 * np.arange(512))
    assert store.stats()["compiles"] == 3


def test_get_kernels_reports_each_failure_and_loads_the_rest(tmp_path) -> None:
    store = FileStreamProgramCache(tmp_path)
    kc = KernelCache(store)
    requests = [
        {"code": SRC, "name": "scale", "options": _options(0)},
        {"code": SRC, "name": "scael", "options": _options(0)},  # no such kernel
        {"code": "this is not C++", "name": "x", "options": _options(0)},  # does not compile
    ]
    with pytest.raises(CompileManyError) as caught:
        kc.get_kernels(requests, device=0)
    err = caught.value
    assert sorted(err.errors) == [1, 2]
    assert isinstance(err.errors[1], ValueError) and "scael" in str(err.errors[1])
    np.testing.assert_allclose(_scale_on(0, err.results[0]), 3.0 * np.arange(512))
    assert err.results[1:] == [None, None]


def test_wrong_kernel_name_is_a_clear_error_and_keeps_the_shared_entry(tmp_path) -> None:
    # The typo used to be read as a corrupt artifact: a warning, the valid
    # shared entry evicted and recompiled, and only then the driver's NOT_FOUND.
    store = FileStreamProgramCache(tmp_path)
    KernelCache(store).get_kernel(SRC, "scale", options=_options(0), device=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelCacheWarning)
        with pytest.raises(ValueError, match=r"no kernel named 'scael' \(its kernels: scale\)"):
            KernelCache(store).get_kernel(SRC, "scael", options=_options(0), device=0)
    s = store.stats()
    assert (s["compiles"], s["errors"]) == (1, 0)  # nothing evicted, nothing recompiled
    assert KernelCache(store).get_kernel(SRC, "scale", options=_options(0), device=0) is not None
    assert store.stats()["compiles"] == 1


def test_a_driver_that_cannot_load_a_good_entry_keeps_it(tmp_path) -> None:
    # PTX newer than this driver (as a peer with a newer driver may share) is
    # not bad bytes; the entry stays for the hosts that can load it, nothing recompiles.
    import re

    from kernelcache import compile_program

    store = FileStreamProgramCache(tmp_path)
    info = CompileInfo()
    compile_program(SRC, "c++", "ptx", options=_options(0), cache=store, info=info)
    ptx, meta = store.get_record(info.key)
    newer = re.sub(rb"\.version \d+\.\d+", b".version 99.9", ptx, count=1)
    store.set_record(info.key, newer, meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelCacheWarning)
        with pytest.raises(Exception, match="UNSUPPORTED_PTX_VERSION"):
            KernelCache(store).get_kernel(SRC, "scale", options=_options(0), device=0, target_type="ptx")
    assert store.get_record(info.key)[0] == newer  # kept as it is
    assert store.stats()["compiles"] == 1


def _in_thread(fn) -> object:
    box: list[object] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:  # reported in the caller's thread
            box.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(120)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _load(kc: KernelCache, how: str, device: int):  # noqa: ANN202 - a cuda.core Kernel
    if how == "get_kernel":
        return kc.get_kernel(TWICE, "scale_twice", options=_options(device), device=device)
    (kernel,) = kc.get_kernels([{"code": TWICE, "name": "scale_twice"}], device=device)
    return kernel


@pytest.mark.parametrize("how", ["get_kernel", "get_kernels"])
def test_a_load_leaves_a_thread_without_a_context_without_one(tmp_path, how) -> None:
    # On one GPU: a fresh thread has no current context; get_kernel(device=0)
    # used to leave device 0's context current in it.
    kc = KernelCache(FileStreamProgramCache(tmp_path))

    def load() -> tuple[int, int]:
        before = _current_context()
        _load(kc, how, 0)
        return before, _current_context()

    assert _in_thread(load) == (0, 0)


@pytest.mark.parametrize("how", ["get_kernel", "get_kernels"])
def test_loading_on_device_1_keeps_the_callers_device_0(tmp_path, how) -> None:
    # A thread working on device 0 asks for a kernel on device 1; its next
    # allocation or launch must still go to device 0.
    if _devices() < 2:
        pytest.skip("needs two GPUs (run on the nvidia-h200-x2 kind)")
    from cuda.core import Device

    kc = KernelCache(FileStreamProgramCache(tmp_path))

    def load() -> tuple[tuple[int, int], tuple[int, int], object]:
        Device(0).set_current()
        before = (_current_context(), Device().device_id)
        kernel = _load(kc, how, 1)
        return before, (_current_context(), Device().device_id), kernel

    before, after, kernel = _in_thread(load)
    assert after == before and before[1] == 0
    np.testing.assert_allclose(_scale_on(1, kernel), 6.0 * np.arange(512))  # loaded for device 1
