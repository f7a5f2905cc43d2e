"""Real kernels nobody on the project wrote (benchmarks/kernels: CuPy's cupyx RawModule sources,
CCCL's CUB NVRTC test kernel), through compile_program: every miss and every hit is the bytes of
a plain cuda.core Program.compile of the same request, and a hit in a fresh process hits.
A sample here (every 9th CuPy kernel and one deep one); benchmarks/bench_real_kernels.py runs
all 183."""

from __future__ import annotations

import os
import sys

import pytest
from cuda.core import ProgramOptions
from helpers import REPO

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

sys.path.insert(0, os.path.join(REPO, "benchmarks", "kernels"))
import corpus  # noqa: E402


@pytest.fixture(scope="module")
def bundled(tmp_path_factory) -> str:
    try:
        return corpus.bundled_headers(str(tmp_path_factory.mktemp("bundled")))
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_misses_and_hits_are_plain_compiles_bytes(tmp_path, bundled) -> None:
    sample = corpus.kernels(bundled, deep=False)[::9] + corpus.kernels(bundled, deep=True)[4:5]
    assert len(sample) >= 20 and sum(k.deep for k in sample) == 1
    cache = FileStreamProgramCache(tmp_path / "cache")
    wrong = []
    for kernel in sample:
        plain = corpus.plain_compile(kernel)
        infos = [CompileInfo(), CompileInfo()]
        got = [
            bytes(
                compile_program(
                    kernel.code,
                    cache=cache,
                    options=ProgramOptions(**kernel.options),
                    name_expressions=kernel.name_expressions,
                    info=info,
                ).code
            )
            for info in infos
        ]
        if [i.hit for i in infos] != [False, True] or not all(corpus.same_code(g, plain) for g in got):
            wrong.append((kernel.name, [i.hit for i in infos], [len(g) for g in got], len(plain)))
        assert not kernel.deep or len(infos[0].headers) > 300, kernel.name
    assert wrong == []
