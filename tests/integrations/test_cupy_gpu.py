"""kernelcache.cupy on a GPU, side by side with CuPy's own classes: the same results for the
same arguments (flag order, relocatable code, cooperative groups, cuComplex, debug builds),
CuPy's CompileException for a failed compile, and a warm fresh process that compiles nothing
and imports no cuda.core."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

cupy = pytest.importorskip("cupy")
kcupy = pytest.importorskip("kernelcache.cupy")

ORDER = r"""
extern "C" __global__ void k(float* o) {
#ifdef FOO
    o[0] = FOO;
#else
    o[0] = -1.0f;
#endif
    int unused_var;
}
"""

DYNAMIC = r"""
extern "C" {
__global__ void inner(float* arr, int n) {
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < n) arr[tid] = 1.0;
}
__global__ void outer(float* arr, int n, int blk) {
    unsigned int tid = blockDim.x * blockIdx.x + threadIdx.x;
    if (tid < n / blk) inner<<<1, blk>>>(arr + tid * blk, blk);
}
}
"""

GRID_SYNC = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void twice(int* x, int* out, int n) {
    cg::grid_group grid = cg::this_grid();
    int i = grid.thread_rank();
    if (i < n) x[i] = i;
    grid.sync();
    if (i < n) out[i] = x[(i + 1) % n] * 2;
}
"""

COMPLEX = r"""
#include <cuComplex.h>
extern "C" __global__ void add(cuDoubleComplex* a, cuDoubleComplex* b, cuDoubleComplex* out, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = cuCmul(cuCadd(a[i], b[i]), a[i]);
}
"""


@pytest.fixture(autouse=True)
def _own_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path / "cupy"))


def _value(cls, flags: tuple[str, ...]) -> float:
    out = cupy.zeros(1, dtype=cupy.float32)
    cls(ORDER, "k", flags)((1,), (1,), (out,))
    return float(out[0])


@pytest.mark.parametrize("flags", [("-UFOO", "-DFOO=7"), ("-DFOO=7", "-UFOO"), ("-DFOO=1", "-DFOO=2")])
def test_flag_order_gives_what_cupy_gives(flags):
    assert _value(kcupy.RawKernel, flags) == _value(cupy.RawKernel, flags)


def test_flags_nvrtc_rejects_in_that_order_fail_as_in_cupy():
    flags = ("-diag-suppress=177", "-diag-error=177")
    with pytest.raises(cupy.cuda.compiler.CompileException):
        _value(cupy.RawKernel, flags)
    with pytest.raises(cupy.cuda.compiler.CompileException, match="unused_var"):
        _value(kcupy.RawKernel, flags)


def test_a_compile_error_is_cupys_compile_exception_with_cupys_message():
    import re

    broken = 'extern "C" __global__ void k(float* o) { o[0] = undeclared; }'
    messages = []
    for cls in (cupy.RawKernel, kcupy.RawKernel):
        with pytest.raises(cupy.cuda.compiler.CompileException) as raised:
            cls(broken, "k").compile()
        # The message is NVRTC's log; only the program name in it differs (CuPy compiles
        # under a temp file's path, kernelcache under a fixed name).
        program = re.escape(raised.value.name) if raised.value.name else "default_program"
        messages.append(re.sub(program + "|/tmp/[^ \"]*\\.cu", "<program>", str(raised.value)))
    assert messages[0] == messages[1]
    assert "<program>" in messages[1] and 'identifier "undeclared" is undefined' in messages[1]


@pytest.mark.parametrize("flag", ["-rdc=true", "-dc"])
def test_dynamic_parallelism_links_cudadevrt_and_the_link_is_cached(flag):
    from kernelcache import default_cache

    n, blk = 1024, 32
    arr = cupy.zeros(n, dtype=cupy.float32)
    kcupy.RawModule(code=DYNAMIC, options=(flag,)).get_function("outer")((n // blk,), (1,), (arr, n, blk))
    assert bool((arr == 1.0).all())
    compiles = default_cache().stats()["compiles"]
    arr[:] = 0
    kcupy.RawModule(code=DYNAMIC, options=(flag,)).get_function("outer")((n // blk,), (1,), (arr, n, blk))
    assert bool((arr == 1.0).all())
    assert default_cache().stats()["compiles"] == compiles  # the second module compiled nothing


def test_cooperative_groups_launch_like_cupy():
    n = 256
    results = []
    for cls in (cupy.RawKernel, kcupy.RawKernel):
        x, out = cupy.zeros(n, dtype=cupy.int32), cupy.zeros(n, dtype=cupy.int32)
        cls(GRID_SYNC, "twice", enable_cooperative_groups=True)((4,), (64,), (x, out, n))
        results.append(cupy.asnumpy(out).tolist())
    assert results[0] == results[1] == [((i + 1) % n) * 2 for i in range(n)]


def test_translate_cucomplex_computes_what_cupy_computes():
    n = 64
    a = cupy.arange(n, dtype=cupy.complex128) * (1 + 2j)
    b = cupy.ones(n, dtype=cupy.complex128) * (3 - 1j)
    results = []
    for cls in (cupy.RawKernel, kcupy.RawKernel):
        out = cupy.zeros(n, dtype=cupy.complex128)
        cls(COMPLEX, "add", translate_cucomplex=True)((1,), (n,), (a, b, out, n))
        results.append(cupy.asnumpy(out))
    assert (results[0] == results[1]).all() and (results[1] == cupy.asnumpy((a + b) * a)).all()


def test_cupy_compile_with_debug_is_read_per_compile_and_keys_apart(monkeypatch):
    from kernelcache import default_cache

    assert _value(kcupy.RawKernel, ("-DFOO=5",)) == 5.0
    before = default_cache().stats()["compiles"]
    monkeypatch.setenv("CUPY_CUDA_COMPILE_WITH_DEBUG", "1")
    assert _value(kcupy.RawKernel, ("-DFOO=5",)) == 5.0
    assert default_cache().stats()["compiles"] == before + 1  # -G -lineinfo: another entry


def test_nvcc_backend_is_cupys_own_object_and_works():
    from kernelcache import KernelCacheWarning

    with pytest.warns(KernelCacheWarning, match="not by kernelcache"):
        kernel = kcupy.RawKernel(ORDER, "k", ("-DFOO=3",), backend="nvcc")
    assert type(kernel) is cupy.RawKernel
    out = cupy.zeros(1, dtype=cupy.float32)
    kernel((1,), (1,), (out,))
    assert float(out[0]) == 3.0


WARM = r"""
import json, sys, time
import cupy
from kernelcache.cupy import RawModule
from kernelcache import default_cache
src = sys.argv[1]
before = default_cache().stats()["compiles"]
mod = RawModule(code=src, options=("-DFOO=9",))
out = cupy.zeros(1, dtype=cupy.float32)
mod.get_function("k")((1,), (1,), (out,))
print(json.dumps({"value": float(out[0]), "compiled": default_cache().stats()["compiles"] - before,
                  "cuda_core": "cuda.core" in sys.modules}))
"""


def test_a_warm_fresh_process_compiles_nothing_and_imports_no_cuda_core(tmp_path):
    def child() -> dict:
        out = subprocess.run([sys.executable, "-c", WARM, ORDER], env=dict(os.environ), capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert (cold["value"], cold["compiled"]) == (9.0, 1)
    assert (warm["value"], warm["compiled"], warm["cuda_core"]) == (9.0, 0, False)


RECORDED = r"""
import json, sys
import cupy
from kernelcache import default_cache
from kernelcache.cupy import RawModule
src = '#include "scale.h"\nextern "C" __global__ void k(float* o) { o[0] = SCALE + FOO; }\n'
before = default_cache().stats()
mod = RawModule(code=src, options=("-I", "inc", "-DFOO=9"))
out = cupy.zeros(1, dtype=cupy.float32)
mod.get_function("k")((1,), (1,), (out,))
after = default_cache().stats()
print(json.dumps({"value": float(out[0]), "compiled": after["compiles"] - before["compiles"]}))
"""


def test_a_recorded_cupy_run_warmed_from_elsewhere_hits_strictly(tmp_path):
    # The lockfile line is CuPy's NVRTC command line verbatim (-I inc: relative to the run's
    # directory), and warm compiles it there: the strict run then hits, compiling nothing.
    proj = tmp_path / "proj"
    (proj / "inc").mkdir(parents=True)
    (proj / "inc" / "scale.h").write_text("#define SCALE 2.0f\n")
    lock, fresh = str(tmp_path / "kernels.lock"), str(tmp_path / "fresh")

    def child(**env: str) -> dict:
        out = subprocess.run([sys.executable, "-c", RECORDED], cwd=proj, env={**os.environ, **env},
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert child(KERNELCACHE_RECORD=lock)["value"] == 11.0
    with open(lock) as f:
        (line,) = [json.loads(raw)["kernel"][0] for raw in f]
    assert "-DFOO=9" in line["nvrtc_argv"] and line["cwd"] == str(proj)
    warm = subprocess.run([sys.executable, "-m", "kernelcache", "warm", lock, "--cache-dir", fresh],
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KERNELCACHE_RECORD": ""})
    assert warm.returncode == 0, warm.stdout + warm.stderr
    strict = child(KERNELCACHE_DIR=fresh, KERNELCACHE_REQUIRE_HIT="1", CUPY_CACHE_DIR=str(tmp_path / "cupy2"))
    assert strict == {"value": 11.0, "compiled": 0}
