"""One rule for "does this option emit a flag", held as cuda.core holds it, for the key, the
directive scan and the decision to trace headers.

``include_path=""`` (and ``[""]``) makes cuda.core pass ``--include-path=``, and NVRTC then
searches the current directory for ``<...>`` includes: such a compile reads a header there
and must be tracked, so that editing the header is a miss with the new code.
"""

from __future__ import annotations

import os

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program, make_program_cache_key
from kernelcache.headers import scan

SOURCE = '#include <cfg.h>\nextern "C" __global__ void k(float* o) { o[threadIdx.x] = VAL; }\n'
VALUES = ["", [""], ".", (), None, [], ["a", ""]]


def _flag_of(field: str) -> bytes:
    return b"--" + field.replace("_", "-").encode() + b"="


@pytest.mark.parametrize("field", ["include_path", "pre_include"])
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_rule_is_cuda_cores(field: str, value: object) -> None:
    """emits_flag says exactly whether cuda.core hands NVRTC the option's flag."""
    from kernelcache.keys.options import emits_flag

    options = ProgramOptions(arch=ARCH, **{field: value})
    given = any(flag.startswith(_flag_of(field)) for flag in options.as_bytes("nvrtc"))
    assert emits_flag(field, value) is given


@pytest.mark.parametrize("value", ["", [""], "."], ids=repr)
def test_an_include_path_that_emits_a_flag_is_traced(value: object) -> None:
    """The trace decision follows the rule: an angle-bracket include then searches a directory."""
    assert scan.may_read_files(SOURCE, ProgramOptions(arch=ARCH, include_path=value))


@pytest.mark.parametrize("value", [(), None, []], ids=repr)
def test_no_flag_no_trace_and_the_key_of_no_include_path(value: object) -> None:
    """No flag: nothing searched beyond NVRTC's own headers, and the key of leaving it out."""
    options = ProgramOptions(arch=ARCH, include_path=value)
    assert not scan.may_read_files(SOURCE, options)
    unset = make_program_cache_key(code=SOURCE, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin")
    assert make_program_cache_key(code=SOURCE, code_type="c++", options=options, target_type="cubin") == unset


@pytest.mark.parametrize("value", ["", [""], "."], ids=repr)
def test_editing_a_header_found_through_an_empty_include_path_is_a_miss(tmp_path, monkeypatch, value) -> None:
    """A real compile with include_path="" reads <cfg.h> from the current directory; after the
    header is edited, the next call compiles again and returns what a fresh compile does."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "cfg.h").write_text("#define VAL 1.0f\n")
    cache = FileStreamProgramCache(tmp_path / "cache")
    options = ProgramOptions(arch=ARCH, include_path=value)

    def compiled() -> tuple[bytes, CompileInfo]:
        settle_timestamps()
        info = CompileInfo()
        return bytes(compile_program(SOURCE, options=options, cache=cache, info=info).code), info

    first, info = compiled()
    assert not info.hit and info.cached
    assert info.headers == [os.path.join(str(work), "cfg.h")]
    again, info = compiled()
    assert info.hit and again == first
    (work / "cfg.h").write_text("#define VAL 2.0f\n")
    edited, info = compiled()
    assert not info.hit, "the edited header was served from the entry compiled with the old one"
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    truth = bytes(compile_program(SOURCE, options=options).code)
    assert edited == truth != first
