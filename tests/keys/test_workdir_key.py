"""The working directory is in compile_program's key exactly when the output can name it: line
info (-lineinfo, -G) with a relative program name or include path writes it into the line
table; otherwise two directories with the same headers share one entry. Real NVRTC, real
directories."""

from __future__ import annotations

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

CODE = '#include "w.h"\nextern "C" __global__ void k(int* o) { o[0] = f(o[1]); }\n'
HEADER = "__device__ int f(int i) { return i * 3 + (i >> 2); }\n"  # code: the line table names it


def _two_dirs(tmp_path):
    dirs = []
    for n in ("one", "two"):
        (tmp_path / n / "inc").mkdir(parents=True)
        (tmp_path / n / "inc" / "w.h").write_text(HEADER)
        dirs.append(tmp_path / n)
    settle_timestamps()
    return dirs


def _compile_in(monkeypatch, where, cache, **options) -> tuple[bool, bytes]:
    monkeypatch.chdir(where)
    info = CompileInfo()
    obj = compile_program(CODE, cache=cache, options=ProgramOptions(arch=ARCH, **options), info=info)
    return info.hit, bytes(obj.code)


@pytest.mark.parametrize("flag", [{"lineinfo": True}, {"debug": True}])
def test_line_info_with_relative_paths_keys_on_the_working_directory(tmp_path, monkeypatch, flag) -> None:
    one, two = _two_dirs(tmp_path)
    cache = FileStreamProgramCache(tmp_path / "cache")
    runs = [_compile_in(monkeypatch, d, cache, include_path=["inc"], **flag) for d in (one, two, one, two)]
    assert [hit for hit, _ in runs] == [False, False, True, True]
    for d, (_, data) in zip((one, two, one, two), runs):
        assert str(d).encode() in data  # each names its own directory, never the other's
        assert str(two if d == one else one).encode() + b"/" not in data


@pytest.mark.parametrize(
    "options",
    [{"include_path": ["inc"]}, {"lineinfo": True, "name": "/abs/k.cu", "include_path": "ABS"}],
    ids=["no-line-info", "line-info-with-absolute-paths"],
)
def test_output_that_names_no_directory_is_shared_between_directories(tmp_path, monkeypatch, options) -> None:
    one, two = _two_dirs(tmp_path)
    (tmp_path / "abs").mkdir()
    (tmp_path / "abs" / "w.h").write_text(HEADER)
    settle_timestamps()
    if options.get("include_path") == "ABS":
        options = {**options, "include_path": [str(tmp_path / "abs")]}
    cache = FileStreamProgramCache(tmp_path / "cache")
    runs = [_compile_in(monkeypatch, d, cache, **options) for d in (one, two)]
    assert [hit for hit, _ in runs] == [False, True]
    assert runs[0][1] == runs[1][1]
