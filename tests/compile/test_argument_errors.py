"""Wrong arguments raise at once, naming what is wrong: as cuda.core raises them where it
refuses them itself, with one clear error where it would pass them on in silence."""

from __future__ import annotations

import io
import pathlib

import pytest
from cuda.core import Program, ProgramOptions
from cuda.core.utils import make_program_cache_key as cuda_core_key
from helpers import ARCH

from kernelcache import InMemoryProgramCache, compile_many, compile_program, make_program_cache_key

SRC = 'extern "C" __global__ void k(float* a) { a[0] = 1; }'
WARNS = 'extern "C" __global__ void w(float* a) { int unused; a[0] = 1; }'


def _cuda_core_error(**fields: object) -> BaseException:
    with pytest.raises(Exception) as caught:
        Program(SRC, "c++", options=ProgramOptions(arch=ARCH, **fields)).compile("cubin")
    with pytest.raises(type(caught.value)) as keyed:
        cuda_core_key(code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH, **fields), target_type="cubin")
    assert str(keyed.value) == str(caught.value)
    return caught.value


@pytest.mark.parametrize("macros", [123, [("A", 1)], ("A", 1), [("A", "1", "2")]], ids=repr)
def test_define_macro_cuda_core_refuses_is_refused_in_its_words(macros: object) -> None:
    expected = _cuda_core_error(define_macro=macros)
    for call in (
        lambda: make_program_cache_key(
            code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH, define_macro=macros), target_type="cubin"
        ),
        lambda: compile_program(SRC, options=ProgramOptions(arch=ARCH, define_macro=macros), cache=InMemoryProgramCache()),
    ):
        with pytest.raises(type(expected)) as caught:
            call()
        assert str(caught.value) == str(expected)


def test_code_none_names_the_argument() -> None:
    with pytest.raises(TypeError, match="code must be str or bytes, not NoneType"):
        make_program_cache_key(code=None, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin")
    with pytest.raises(TypeError, match="code must be str or bytes, not NoneType"):
        compile_program(None, options=ProgramOptions(arch=ARCH), cache=InMemoryProgramCache())  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["include_path", "pre_include"])
@pytest.mark.parametrize("value", [5, 5.0, b"inc", pathlib.Path("/inc"), {"inc"}], ids=repr)
def test_a_path_field_cuda_core_would_drop_or_mangle_is_refused(field: str, value: object) -> None:
    # cuda.core passes nothing for 5, a Path or a set, one flag per byte for b"inc": one clear error.
    options = ProgramOptions(arch=ARCH, **{field: value})
    for call in (
        lambda: make_program_cache_key(code=SRC, code_type="c++", options=options, target_type="cubin"),
        lambda: compile_program(SRC, options=options, cache=InMemoryProgramCache()),
    ):
        with pytest.raises(TypeError, match=f"ProgramOptions.{field} must be a str or a list or tuple"):
            call()


@pytest.mark.parametrize("logs", [5, "log.txt", object()], ids=repr)
def test_logs_without_write_is_refused_before_compiling(logs: object) -> None:
    cache = InMemoryProgramCache()
    with pytest.raises(TypeError, match="logs must have a write"):
        compile_program(WARNS, options=ProgramOptions(arch=ARCH), cache=cache, logs=logs)
    assert len(cache) == 0  # nothing compiled, nothing stored
    sink = io.StringIO()
    compile_program(WARNS, options=ProgramOptions(arch=ARCH), cache=cache, logs=sink)
    assert "unused" in sink.getvalue()


@pytest.mark.parametrize("requests", [None, 5], ids=repr)
def test_compile_many_of_no_sequence_names_the_argument(requests: object) -> None:
    with pytest.raises(TypeError, match="requests must be a sequence of mappings"):
        compile_many(requests, cache=InMemoryProgramCache())  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["unix://", "unix:///", "unix://?db=0", "unix://host/run/redis.sock"])
def test_a_unix_url_without_a_socket_path_is_refused(url: str) -> None:
    pytest.importorskip("redis")
    from kernelcache import RedisProgramCache

    with pytest.raises(ValueError, match="socket"):
        RedisProgramCache(url)


def test_a_unix_url_with_a_socket_path_is_accepted() -> None:
    pytest.importorskip("redis")
    from kernelcache import RedisProgramCache

    RedisProgramCache("unix:///run/redis/redis.sock?db=1").close()  # no I/O until the first call
