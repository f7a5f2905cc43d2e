"""KERNELCACHE_WAIT_TIMEOUT=inf (and wait_timeout=math.inf): wait for a peer's compile forever.

NaN, negative values and non-numbers stay errors, raised at once and naming the variable.
Real threads contend for one key, so the waits (thread lock, file lock) take the value.
"""

from __future__ import annotations

import math
import threading

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
from kernelcache.config import ConfigError

SRC = 'extern "C" __global__ void k(float* a) { a[threadIdx.x] = 7.0f; }'


def _contend(cache: FileStreamProgramCache, wait_timeout: float | None) -> list[CompileInfo]:
    infos = [CompileInfo() for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(infos))

    def one(info: CompileInfo) -> None:
        start.wait()
        try:
            compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=cache, info=info, wait_timeout=wait_timeout)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(info,)) for info in infos]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return infos


@pytest.mark.parametrize("spelling", ["inf", "Infinity", " +INF "])
def test_wait_timeout_inf_means_wait_forever(tmp_path, monkeypatch, spelling: str) -> None:
    monkeypatch.setenv("KERNELCACHE_WAIT_TIMEOUT", spelling)
    infos = _contend(FileStreamProgramCache(tmp_path), None)
    assert sum(not info.hit for info in infos) == 1  # one compile, every other caller waited for it


def test_wait_timeout_argument_inf_means_wait_forever(tmp_path) -> None:
    infos = _contend(FileStreamProgramCache(tmp_path), math.inf)
    assert sum(not info.hit for info in infos) == 1


@pytest.mark.parametrize("value", ["nan", "-1", "-inf", "soon", "1e10"])
def test_other_wait_timeouts_stay_errors(tmp_path, monkeypatch, value: str) -> None:
    monkeypatch.setenv("KERNELCACHE_WAIT_TIMEOUT", value)
    with pytest.raises(ConfigError, match="KERNELCACHE_WAIT_TIMEOUT"):
        compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=FileStreamProgramCache(tmp_path))
