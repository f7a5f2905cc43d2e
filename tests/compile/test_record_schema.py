"""The metadata schema version inside every artifact record, checked on every read.

Another kernelcache version sharing a team directory or a Redis namespace writes records
whose metadata has another shape under the same key. Such a record passes its checksum (it
is not damaged), so the check is the schema: a record of another schema, or of this schema
with another shape, is a miss that compiles, never an error and never a removal. The
records here are written through the real stores, exactly as another version's code would.
"""

from __future__ import annotations

import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH

from kernelcache import (
    CompileInfo,
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    TieredProgramCache,
    compile_program,
    probe,
)
from kernelcache.compile.schema import META_SCHEMA, meta_is_usable

AXPY = "template <typename T> __global__ void axpy(T a, T* x) { x[threadIdx.x] *= a; }"
EXPRS = ("axpy<float>",)


def _compile(cache, info: CompileInfo | None = None):
    return compile_program(
        AXPY, options=ProgramOptions(arch=ARCH), name_expressions=EXPRS, cache=cache, info=info or CompileInfo()
    )


def _stores(tmp_path):
    return [
        FileStreamProgramCache(tmp_path / "file"),
        InMemoryProgramCache(),
        TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "tier")]),
    ]


def _good_meta(cache, key: bytes) -> dict:
    record = cache.get_record(key)
    assert record is not None
    return record[1]


# What another version might have stored: every field a hit reads, in another shape; or a
# metadata of this shape from a schema this version does not know (or from before the
# schema was versioned at all).
OTHER_SHAPES = {
    "symbols-of-three": lambda m: {**m, "symbols": [["s", "axpy<float>", "x"]]},
    "symbols-as-dict": lambda m: {**m, "symbols": {"axpy<float>": "_Z4axpyIfEvT_PS0_"}},
    "seconds-as-text": lambda m: {**m, "compile_seconds": "0.2 s"},
    "log-as-list": lambda m: {**m, "log": ["line"]},
    "future-schema": lambda m: {**m, "schema": META_SCHEMA + 1},
    "no-schema": lambda m: {k: v for k, v in m.items() if k != "schema"},
    "schema-as-text": lambda m: {**m, "schema": str(META_SCHEMA)},
}


@pytest.mark.parametrize("shape", sorted(OTHER_SHAPES))
def test_a_record_of_another_schema_or_shape_is_a_miss_not_an_error(tmp_path, shape: str) -> None:
    for cache in _stores(tmp_path / shape):
        first = CompileInfo()
        expected = _compile(cache, first)
        assert not first.hit
        warm = CompileInfo()
        _compile(cache, warm)  # a hit first: this version's metadata is known usable in this process
        assert warm.hit
        other = OTHER_SHAPES[shape](_good_meta(cache, first.key))
        assert cache.set_record(first.key, bytes(expected.code), other)  # another version's write

        assert not probe(AXPY, options=ProgramOptions(arch=ARCH), name_expressions=EXPRS, cache=cache).hit
        with warnings.catch_warnings():
            warnings.simplefilter("error", KernelCacheWarning)  # not judged damaged: no warning
            again = CompileInfo()
            obj = _compile(cache, again)
        assert not again.hit, f"{shape} in {type(cache).__name__} served as a hit"
        assert bytes(obj.code) == bytes(expected.code)
        assert dict(obj.symbol_mapping) == dict(expected.symbol_mapping)
        assert cache.stats().get("errors", 0) == 0
        # The miss stored this version's record under the key: the next call is a hit.
        third = CompileInfo()
        _compile(cache, third)
        assert third.hit and third.key == first.key


def test_a_record_of_another_schema_is_not_removed_by_the_reader(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    first = CompileInfo()
    expected = _compile(cache, first)
    other = {**_good_meta(cache, first.key), "schema": META_SCHEMA + 1}
    cache.set_record(first.key, bytes(expected.code), other)
    assert not probe(AXPY, options=ProgramOptions(arch=ARCH), name_expressions=EXPRS, cache=cache).hit
    # Still there, exactly as the other version wrote it: a reader judges nothing.
    record = cache.get_record(first.key)
    assert record is not None and record[1]["schema"] == META_SCHEMA + 1


def test_every_stored_artifact_carries_this_schema(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    info = CompileInfo()
    _compile(cache, info)
    meta = _good_meta(cache, info.key)
    assert meta["schema"] == META_SCHEMA and meta_is_usable(meta)
    assert type(META_SCHEMA) is int and META_SCHEMA == 2  # 1 was the unversioned metadata


def test_explain_passes_over_a_record_of_another_shape(tmp_path) -> None:
    import json

    from helpers import kc

    cache_dir = str(tmp_path / "cache")
    code = 'extern "C" __global__ void k(float* x) { x[0] = 1; }'
    (tmp_path / "b.json").write_text(json.dumps({"kernel": [{"name": "k", "code": code, "arch": "sm_80"}]}))
    cache = FileStreamProgramCache(cache_dir)
    info = CompileInfo()
    obj = compile_program(code, options=ProgramOptions(arch=ARCH), cache=cache, info=info)
    other = {**_good_meta(cache, info.key), "kernels": [["k"]], "options": ["arch"], "toolchain": "?"}
    cache.set_record(info.key, bytes(obj.code), other)
    missed = kc("explain", str(tmp_path / "b.json"), "--json", cache=cache_dir, check=False)
    assert missed.returncode == 1, missed.stderr  # not in the cache, and no Traceback
    result = json.loads(missed.stdout)
    # What differs comes from the source index (the key's components), never from that record.
    assert result["in_cache"] is False and result["differences"] == {"options.arch": ["'sm_90'", "'sm_80'"]}
    by_prefix = kc("explain", info.entry_name[:16], "--json", cache=cache_dir, check=False)
    assert by_prefix.returncode == 1, by_prefix.stderr  # there, but not a record this version uses
    assert "another version" in json.loads(by_prefix.stdout)["unusable"]
