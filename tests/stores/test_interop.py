"""Drop-in for cuda.core, both directions.

kernelcache's stores are cuda.core ProgramCacheResources (``Program.compile(cache=...)``
takes them: miss, then hit), and compile_program takes cuda.core's own stores with
everything it adds (metadata checked by digest, header tracking, single flight).
"""

from __future__ import annotations

import multiprocessing as mp
import os

import _workers as w
import pytest
from cuda.core import Program, ProgramOptions
from cuda.core import utils as cc
from helpers import ARCH, run_python, settle_timestamps
from sources import HEAVY, needs_bundled_headers

from kernelcache import (
    CompileInfo,
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCache,
    ProgramCacheResource,
    TieredProgramCache,
    compile_program,
)
from kernelcache.runners.compilers import driver_available
from kernelcache.stores import cuda_core

SRC = 'extern "C" __global__ void fill(float* a, float v) { a[threadIdx.x] = v; }\n'
TEMPLATE = "template <typename T> __global__ void scale(T* a, T v) { a[threadIdx.x] *= v; }\n"


class DictStore(ProgramCacheResource):
    """A user's own subclass of kernelcache's ABC: a dict, nothing else."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.gets = 0

    def __getitem__(self, key: bytes | str) -> bytes:
        self.gets += 1
        return self.data[key if isinstance(key, bytes) else key.encode()]

    def __setitem__(self, key: bytes | str, value: object) -> None:
        from kernelcache.stores.base import as_value_bytes

        self.data[key if isinstance(key, bytes) else key.encode()] = as_value_bytes(value)

    def __delitem__(self, key: bytes | str) -> None:
        del self.data[key if isinstance(key, bytes) else key.encode()]

    def __len__(self) -> int:
        return len(self.data)

    def clear(self) -> None:
        self.data.clear()


def kernelcache_stores(tmp_path) -> list[ProgramCacheResource]:
    return [
        InMemoryProgramCache(),
        FileStreamProgramCache(str(tmp_path / "fs")),
        TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(str(tmp_path / "tier"))]),
        DictStore(),
    ]


# -- kernelcache -> cuda.core ------------------------------------------------------------


def test_every_store_is_a_cuda_core_program_cache_resource(tmp_path) -> None:
    for store in kernelcache_stores(tmp_path):
        assert isinstance(store, cc.ProgramCacheResource), type(store).__name__
    assert issubclass(ProgramCacheResource, cc.ProgramCacheResource)


@pytest.mark.parametrize("cuda_core_first", [True, False])
def test_registration_holds_whichever_is_imported_first(cuda_core_first: bool) -> None:
    first, second = "import cuda.core", "import kernelcache; s = kernelcache.InMemoryProgramCache()"
    code = "\n".join(
        [
            "import sys",
            *((first, second) if cuda_core_first else (second, first)),
            "from cuda.core.utils import ProgramCacheResource",
            "print(isinstance(s, ProgramCacheResource), isinstance(kernelcache.FileStreamProgramCache, type))",
        ]
    )
    assert run_python(code).split() == ["True", "True"]


def test_using_a_store_does_not_import_cuda_core(tmp_path) -> None:
    code = (
        "import sys, kernelcache\n"
        f"s = kernelcache.FileStreamProgramCache({str(tmp_path)!r}); s[b'k'] = b'v'; s.stats()\n"
        "print(sorted(m for m in sys.modules if m.startswith('cuda')))\n"
    )
    assert run_python(code).strip() == "[]"


def _compile(store: object, target: str, **kw: object) -> bytes:
    program = Program(SRC, "c++", options=ProgramOptions(arch=ARCH, **kw))
    try:
        return bytes(program.compile(target, cache=store).code)
    finally:
        program.close()


def targets() -> list[str]:
    # cuda.core 1.2's Program.compile("ptx") asks the driver whether it can load the PTX,
    # so PTX needs a GPU machine (tests/stores/test_gpu_interop.py runs it there).
    return ["cubin", "ltoir"] + (["ptx"] if driver_available() else [])


@pytest.mark.parametrize("target", targets())
def test_program_compile_misses_then_hits_on_each_kernelcache_store(tmp_path, target: str) -> None:
    kw = {"link_time_optimization": True} if target == "ltoir" else {}
    for store in kernelcache_stores(tmp_path / target):
        first = _compile(store, target, **kw)
        assert len(store) >= 1, type(store).__name__
        if isinstance(store, DictStore):
            before = store.gets
            assert _compile(store, target, **kw) == first
            assert store.gets == before + 1  # the hit: one read, and no second entry
            assert len(store) == 1
            continue
        stats = store.stats()
        assert (stats["misses"], stats["hits"], stats["stores"]) == (1, 0, 1), type(store).__name__
        assert _compile(store, target, **kw) == first
        stats = store.stats()
        assert (stats["misses"], stats["hits"], stats["stores"]) == (1, 1, 1), type(store).__name__


def test_program_compile_hit_survives_reopening_the_file_store(tmp_path) -> None:
    root = str(tmp_path / "fs")
    with FileStreamProgramCache(root) as store:
        first = _compile(store, "cubin")
    code = (
        "from cuda.core import Program, ProgramOptions\n"
        "import kernelcache\n"
        f"s = kernelcache.FileStreamProgramCache({root!r})\n"
        f"p = Program({SRC!r}, 'c++', options=ProgramOptions(arch={ARCH!r}))\n"
        "print(bytes(p.compile('cubin', cache=s).code).hex(), s.stats()['hits'], s.stats()['misses'])\n"
    )
    hexed, hits, misses = run_python(code).split()
    assert bytes.fromhex(hexed) == first and (hits, misses) == ("1", "1")  # counters persist on disk


# -- cuda.core -> kernelcache ------------------------------------------------------------


def cuda_core_stores(tmp_path) -> list[object]:
    return [cc.InMemoryProgramCache(), cc.FileStreamProgramCache(str(tmp_path / "ccfs"))]


def test_compile_program_takes_cuda_core_stores_miss_then_hit(tmp_path) -> None:
    for store in cuda_core_stores(tmp_path):
        infos = [CompileInfo(), CompileInfo()]
        logs = []
        for info in infos:
            obj = compile_program(
                TEMPLATE,
                options=ProgramOptions(arch=ARCH),
                cache=store,
                name_expressions=("scale<float>",),
                info=info,
            )
            logs.append(obj)
        assert [i.hit for i in infos] == [False, True], type(store).__name__
        # the symbol mapping is replayed from the record kept under the derived key
        assert logs[0].symbol_mapping == logs[1].symbol_mapping
        assert "scale<float>" in logs[1].symbol_mapping
        assert bytes(logs[0].code) == bytes(logs[1].code)
        # the artifact sits under its key as raw bytes, readable by cuda.core itself
        assert store[infos[0].key] == bytes(logs[0].code)
        assert store.get(cuda_core.meta_key(infos[0].key)) is not None


def test_the_readme_snippets(tmp_path) -> None:
    """Both directions as the README shows them: our store into Program.compile, cuda.core's into compile_program."""
    program = Program(SRC, "c++", options=ProgramOptions(arch=ARCH))
    ours = FileStreamProgramCache(str(tmp_path / "ours"))
    assert program.compile("cubin", cache=ours).code == program.compile("cubin", cache=ours).code
    assert ours.stats()["hits"] == 1
    theirs = cc.FileStreamProgramCache(str(tmp_path / "theirs"))
    info = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=theirs)
    compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=theirs, info=info)
    assert info.hit


def test_a_payload_that_does_not_match_its_record_is_a_miss(tmp_path) -> None:
    store = cc.FileStreamProgramCache(str(tmp_path / "cc"))
    info = CompileInfo()
    good = bytes(compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=store, info=info).code)
    store[info.key] = b"\x7fELF planted, not what was compiled"
    again = CompileInfo()
    obj = compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=store, info=again)
    assert not again.hit and bytes(obj.code) == good
    assert store[info.key] == good  # the miss rewrote payload and record together

    del store[cuda_core.meta_key(info.key)]  # a payload whose record is gone: a miss too
    last = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=store, info=last)
    assert not last.hit


def test_derived_record_keys_never_equal_a_kernelcache_key(tmp_path) -> None:
    store = cc.InMemoryProgramCache()
    info = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=store, info=info)
    derived = cuda_core.meta_key(info.key)
    assert len(info.key) == 32 and len(derived) == 32 + len(cuda_core.META_PREFIX)
    assert derived.startswith(cuda_core.META_PREFIX) and not info.key.startswith(cuda_core.META_PREFIX[:1] * 18)


def test_header_tracking_works_on_a_cuda_core_store(tmp_path) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    header = inc / "value.h"
    header.write_text("#define VALUE 1.0f\n")
    settle_timestamps()  # the header is older than the compile's start (else it is not stored)
    src = '#include "value.h"\nextern "C" __global__ void f(float* a) { a[0] = VALUE; }\n'
    store = cc.FileStreamProgramCache(str(tmp_path / "cc"))
    options = ProgramOptions(arch=ARCH, include_path=[str(inc)])
    first, second, third = CompileInfo(), CompileInfo(), CompileInfo()
    a = compile_program(src, options=options, cache=store, info=first)
    compile_program(src, options=options, cache=store, info=second)
    header.write_text("#define VALUE 2.0f\n")
    settle_timestamps()
    b = compile_program(src, options=options, cache=store, info=third)
    assert (first.hit, second.hit, third.hit) == (False, True, False)
    assert bytes(a.code) != bytes(b.code)
    assert str(header) in third.headers


@needs_bundled_headers
def test_processes_sharing_a_cuda_core_file_store_compile_once(tmp_path) -> None:
    root = str(tmp_path / "cc")
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        results = pool.starmap(w.compile_heavy, [(root, HEAVY, ARCH, "cuda.core")] * 4)
    assert sorted(hit for hit, _ in results) == [False, True, True, True]
    assert len({code for _, code in results}) == 1
    assert os.listdir(os.path.join(root, "kernelcache-locks"))  # the flock lived beside entries/


def test_kernel_cache_takes_a_cuda_core_store() -> None:
    kc = KernelCache(cache=cc.InMemoryProgramCache())
    assert isinstance(kc._store, ProgramCacheResource)
    with pytest.raises(TypeError, match="ProgramCacheResource"):
        KernelCache(cache={})


def test_anything_else_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="kernelcache's or cuda.core.utils'.*dict"):
        compile_program(SRC, options=ProgramOptions(arch=ARCH), cache={})


def test_program_compile_misses_then_hits_on_a_redis_store(tmp_path) -> None:
    pytest.importorskip("redis", reason="the redis client is the 'redis' extra")
    from redis_servers import RedisServer, need_redis

    from kernelcache import RedisProgramCache

    need_redis()
    server = RedisServer(str(tmp_path / "redis"))
    try:
        with RedisProgramCache(server.url, namespace="interop") as store:
            assert isinstance(store, cc.ProgramCacheResource)
            first = _compile(store, "cubin")
            assert _compile(store, "cubin") == first
            stats = store.stats()
            assert (stats["misses"], stats["hits"], stats["stores"]) == (1, 1, 1)
    finally:
        server.stop()
