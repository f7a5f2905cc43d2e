"""ProgramOptions.name assigned after construction: what the compiler is given is what counts.

cuda.core encodes ``name`` once, when the ProgramOptions is constructed, and names the NVRTC
program (``__FILE__``, debug info, the directory quoted includes are searched in) and the
ObjectCode by that encoded name. A ``name`` assigned afterwards changes neither. The key,
the header search and the ObjectCode must follow the encoded name, with or without a cache:
the reference is always cuda.core's own Program on the same options object.
"""

from __future__ import annotations

import pytest
from cuda.core import Program, ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program, make_program_cache_key

# __FILE__ puts the program name into the cubin's data.
FILE_SRC = r"""__device__ const char file[] = __FILE__;
extern "C" __global__ void k(char* o) { o[0] = file[1]; }"""


def late(later: str, **kw) -> ProgramOptions:
    """ProgramOptions(**kw) whose name is assigned ``later``, after construction."""
    options = ProgramOptions(arch=ARCH, **kw)
    options.name = later
    return options


def cuda_core(code: str, options: ProgramOptions):
    return Program(code, "c++", options=options).compile("cubin")


def test_the_key_follows_the_name_the_compiler_is_given() -> None:
    def key(options: ProgramOptions) -> bytes:
        return make_program_cache_key(code=FILE_SRC, code_type="c++", options=options, target_type="cubin")

    # NVRTC is given "default_program" for late("late_name"): the same compile as no name at all.
    assert bytes(cuda_core(FILE_SRC, late("late_name")).code) == bytes(cuda_core(FILE_SRC, ProgramOptions(arch=ARCH)).code)
    assert key(late("late_name")) == key(ProgramOptions(arch=ARCH))
    assert key(late("late_name")) != key(ProgramOptions(arch=ARCH, name="late_name"))
    assert key(late("other", name="first")) == key(ProgramOptions(arch=ARCH, name="first"))


def test_a_name_with_a_directory_given_at_construction_is_refused_after_a_rename() -> None:
    # NVRTC reads quoted includes relative to the encoded name's directory: the key cannot see them.
    options = late("prog.cu", name="sub/prog.cu")
    with pytest.raises(ValueError, match="directory component"):
        make_program_cache_key(code=FILE_SRC, code_type="c++", options=options, target_type="cubin")
    # And the other way round, the directory assigned later is not what NVRTC searches: no refusal.
    make_program_cache_key(code=FILE_SRC, code_type="c++", options=late("sub/prog.cu"), target_type="cubin")


@pytest.mark.parametrize("cached", [True, False])
def test_compile_program_compiles_what_cuda_core_compiles(tmp_path, monkeypatch, cached: bool) -> None:
    if not cached:
        monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    cache = FileStreamProgramCache(tmp_path / "cache")
    # First a compile whose program really is named late_name (stored when cached) ...
    named = ProgramOptions(arch=ARCH, name="late_name")
    compile_program(FILE_SRC, options=named, cache=cache)
    # ... then options whose name was assigned later: cuda.core compiles default_program.
    for _ in range(2):  # a miss (or uncached), then a hit
        options = late("late_name")
        expected = cuda_core(FILE_SRC, options)
        obj = compile_program(FILE_SRC, options=options, cache=cache)
        # Plain values in the asserts: repr() of an ObjectCode may wait for a driver.
        ours, theirs, name, their_name = bytes(obj.code), bytes(expected.code), obj.name, expected.name
        assert b"late_name" not in ours
        assert ours == theirs
        assert name == their_name == "default_program"


def test_quoted_includes_are_searched_where_the_encoded_name_points(tmp_path, monkeypatch) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    header = sub / "h.h"
    header.write_text("#define VALUE 1\n")
    settle_timestamps()
    src = '#include "h.h"\nextern "C" __global__ void k(int* o) { o[0] = VALUE; }'
    cache = FileStreamProgramCache(tmp_path / "cache")

    def both() -> tuple[bytes, bytes, CompileInfo]:
        options = late("prog.cu", name=str(sub / "prog.cu"))  # NVRTC still searches sub/
        info = CompileInfo()
        ours = bytes(compile_program(src, options=options, cache=cache, info=info).code)
        return ours, bytes(cuda_core(src, options).code), info

    ours, theirs, first = both()
    assert ours == theirs and not first.hit
    assert str(header) in first.headers
    header.write_text("#define VALUE 2\n")
    settle_timestamps()
    ours, theirs, second = both()
    assert not second.hit and ours == theirs
    assert both()[2].hit


def test_a_header_created_in_the_encoded_names_directory_is_a_miss(tmp_path, monkeypatch) -> None:
    # NVRTC tries the encoded name's directory before include_path: a header created there
    # later shadows the one the first compile read.
    sub, inc = tmp_path / "sub", tmp_path / "inc"
    sub.mkdir()
    inc.mkdir()
    monkeypatch.chdir(tmp_path)
    (inc / "h.h").write_text("#define VALUE 1\n")
    settle_timestamps()
    src = '#include "h.h"\nextern "C" __global__ void k(int* o) { o[0] = VALUE; }'
    cache = FileStreamProgramCache(tmp_path / "cache")

    def both() -> tuple[bytes, bytes, CompileInfo]:
        options = late("prog.cu", name=str(sub / "prog.cu"), include_path=[str(inc)])
        info = CompileInfo()
        ours = bytes(compile_program(src, options=options, cache=cache, info=info).code)
        return ours, bytes(cuda_core(src, options).code), info

    ours, theirs, first = both()
    assert ours == theirs and not first.hit
    assert both()[2].hit
    (sub / "h.h").write_text("#define VALUE 2\n")
    settle_timestamps()
    ours, theirs, shadowed = both()
    assert not shadowed.hit, "a stale hit: the header NVRTC reads now was not looked for"
    assert ours == theirs
