"""On a GPU: Program.compile(cache=<kernelcache store>) hits, and the kernel from the hit runs.

Run: PYTHONPATH=src python3 -m pytest -q -m gpu tests/stores/test_gpu_interop.py
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_kernels import SRC, _scale_on

from kernelcache import FileStreamProgramCache, InMemoryProgramCache, TieredProgramCache

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("target", ["cubin", "ptx"])
@pytest.mark.parametrize("kind", ["file", "memory", "tiered"])
def test_program_compile_hit_from_a_kernelcache_store_loads_and_runs(tmp_path, kind: str, target: str) -> None:
    from cuda.core import Device, Program, ProgramOptions

    dev = Device(0)
    dev.set_current()
    major, minor = dev.compute_capability
    options = ProgramOptions(arch=f"sm_{major}{minor}", name="interop_scale")
    store = {
        "file": lambda: FileStreamProgramCache(str(tmp_path / "fs")),
        "memory": InMemoryProgramCache,
        "tiered": lambda: TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(str(tmp_path / "t"))]),
    }[kind]()

    def compile_once() -> object:
        program = Program(SRC, "c++", options=options)
        try:
            return program.compile(target, cache=store)
        finally:
            program.close()

    miss = compile_once()
    hit = compile_once()
    stats = store.stats()
    assert (stats["misses"], stats["hits"], stats["stores"]) == (1, 1, 1), stats
    assert bytes(hit.code) == bytes(miss.code)
    out = _scale_on(0, hit.get_kernel("scale"), 1024)  # the kernel of the HIT, loaded and launched
    np.testing.assert_array_equal(out, np.arange(1024, dtype=np.float32) * 3.0)
