"""A header that appears during a compile that skipped the header pass (compile.tracing), at a
place an #include searches before the place the remembered variant resolved it to: NVRTC reads
it, and no trace says so. The rebuild beside the compile resolved the probe before the file
appeared; the check again after the compile (headers.digests.changed_during, untraced) finds the
file there and refuses to store. Found by an adversarial pass: before the fix the result, compiled
with the new header, was stored under the old variant, and once the new header was removed that
variant held again and the wrong kernel was a hit, in a fresh process too.

The same race on a compile that runs its header pass is refused as well (the pass lists the new
header, stamped after the start): test_the_same_race_with_a_pass_is_not_stored.
"""

from __future__ import annotations

import threading
import time
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

# About 2 s of NVRTC front end (constexpr evaluation) before it looks for val.h: the new header
# is created 0.6 s into the compile, after the rebuild beside it, before NVRTC's look-up.
SPIN = "\n".join(f'static_assert(spin({500000 + i}) != 1, "");' for i in range(10))
SOURCE = (
    "__device__ constexpr unsigned spin(unsigned n)"
    " { unsigned s = 0; for (unsigned i = 0; i < n; ++i) s += i ^ (s >> 3); return s; }\n"
    + SPIN
    + '\n#include "val.h"\n'
    + "template <int N> __global__ void k(float* o) { o[threadIdx.x] = VAL * N; }\n"
)


@pytest.fixture
def proj(tmp_path, monkeypatch):
    proj, inc = tmp_path / "proj", tmp_path / "inc"
    proj.mkdir()
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 1.0f\n")
    monkeypatch.chdir(proj)
    return proj, inc


def compiled(cache, n: int, inc) -> tuple[bytes, CompileInfo]:
    settle_timestamps()
    info = CompileInfo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obj = compile_program(
            SOURCE,
            cache=cache,
            info=info,
            options=ProgramOptions(arch=ARCH, include_path=[str(inc)]),
            name_expressions=[f"k<{n}>"],
        )
    return bytes(obj.code), info


def truth(monkeypatch, n: int, inc) -> bytes:
    with monkeypatch.context() as m:
        m.setenv("KERNELCACHE_DISABLE", "1")
        return compiled(None, n, inc)[0]


def shadow_during(proj) -> threading.Thread:
    def later() -> None:
        time.sleep(0.6)
        (proj / "val.h").write_text("#define VAL 7.0f\n")  # the includer's own dir: searched before inc/

    t = threading.Thread(target=later)
    t.start()
    return t


def test_a_header_appearing_during_a_compile_without_a_pass_is_never_a_wrong_hit(tmp_path, proj, monkeypatch):
    proj, inc = proj
    cache = FileStreamProgramCache(tmp_path / "cache")
    assert compiled(cache, 1, inc)[1].header_pass  # the pass: val.h found in inc/
    t = shadow_during(proj)
    try:
        _, info = compiled(cache, 2, inc)  # no pass: the rebuild of [inc/val.h] holds
    finally:
        t.join()
    assert not info.header_pass and not info.cached and "appeared on the search path" in info.not_stored
    (proj / "val.h").unlink()  # back to the files the variant names
    data, info = compiled(cache, 2, inc)
    assert data == truth(monkeypatch, 2, inc), f"served a kernel of VAL 7.0f (hit={info.hit})"


def test_the_same_race_with_a_pass_is_not_stored(tmp_path, proj):
    proj, inc = proj
    cache = FileStreamProgramCache(tmp_path / "cache")
    t = shadow_during(proj)
    try:
        _, info = compiled(cache, 1, inc)
    finally:
        t.join()
    assert info.header_pass and not info.cached and "changed during the compile" in info.not_stored
