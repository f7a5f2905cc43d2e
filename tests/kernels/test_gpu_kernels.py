"""KernelCache on real GPUs: L1/L2 hits, per-device modules, eviction, healing a corrupt entry."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gpu_kernels import SRC, _scale_on

from kernelcache import CompileInfo, FileStreamProgramCache, KernelCache, KernelCacheWarning

pytestmark = pytest.mark.gpu

def _devices() -> int:
    from cuda.core import system

    try:
        return int(system.get_num_devices())
    except Exception:  # older cuda.core
        return int(system.num_devices)


def _options(device_id: int):
    from cuda.core import Device, ProgramOptions

    major, minor = Device(device_id).compute_capability
    return ProgramOptions(arch=f"sm_{major}{minor}")


def test_get_kernel_l1_and_l2_hits(tmp_path) -> None:
    store = FileStreamProgramCache(tmp_path)
    kc = KernelCache(store)
    k1 = kc.get_kernel(SRC, "scale", options=_options(0), device=0)
    assert kc.get_kernel(SRC, "scale", options=_options(0), device=0) is k1  # L1 hit: same object
    np.testing.assert_allclose(_scale_on(0, k1), 3.0 * np.arange(512))
    s = store.stats()
    assert (s["compiles"], s["misses"], s["hits"]) == (1, 1, 0)
    kc2 = KernelCache(store)  # a new L1 over the same L2: loads without compiling
    k2 = kc2.get_kernel(SRC, "scale", options=_options(0), device=0)
    np.testing.assert_allclose(_scale_on(0, k2), 3.0 * np.arange(512))
    s = store.stats()
    assert (s["compiles"], s["hits"]) == (1, 1)


def test_two_gpus_evict_one_other_keeps_working(tmp_path) -> None:
    if _devices() < 2:
        pytest.skip("needs two GPUs (run on the nvidia-h200-x2 kind)")
    kc = KernelCache(FileStreamProgramCache(tmp_path))
    k0 = kc.get_kernel(SRC, "scale", options=_options(0), device=0)
    k1 = kc.get_kernel(SRC, "scale", options=_options(1), device=1)
    assert k0 is not k1 and len(kc) == 2  # one module per device
    kc.evict_device(1)
    assert len(kc) == 1
    assert kc.get_kernel(SRC, "scale", options=_options(0), device=0) is k0  # device 0 untouched
    np.testing.assert_allclose(_scale_on(0, k0), 3.0 * np.arange(512))
    k1b = kc.get_kernel(SRC, "scale", options=_options(1), device=1)  # reloaded (L2 hit)
    assert k1b is not k1
    np.testing.assert_allclose(_scale_on(1, k1b), 3.0 * np.arange(512))


def test_corrupt_cached_artifact_is_healed_at_load(tmp_path) -> None:
    from kernelcache import compile_program

    store = FileStreamProgramCache(tmp_path)
    info = CompileInfo()
    compile_program(SRC, options=_options(0), cache=store, info=info)
    # Plant bytes the driver cannot load under the entry's own metadata (so the store's
    # integrity check and the schema check pass: the damage is only visible to the driver).
    meta = store.get_record(info.key)[1]
    store.set_record(info.key, b"\x7fELF" + b"\0" * 60 + b"not a cubin", meta)
    kc = KernelCache(store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = kc.get_kernel(SRC, "scale", options=_options(0), device=0)
    assert any(issubclass(w.category, KernelCacheWarning) for w in caught)
    np.testing.assert_allclose(_scale_on(0, kernel), 3.0 * np.arange(512))
    assert store.stats()["compiles"] == 2
    assert store.stats()["errors_by_cause"] == {"driver": 1}  # counted under its cause
