"""A miss whose preprocessing this process traced before skips the header pass only while the
headers that pass listed still hold (compile.tracing): real headers, real edits, real NVRTC.

Each test compiles one templated source for several name expressions (what CuPy and jitify do:
one instantiation per compile). The first compile's pass lists the headers; the later ones are
built from that list, and must notice every change that makes it wrong: a header that now
includes another, a new header shadowing the one found, an edit during the compile.
"""

from __future__ import annotations

import json
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, rewritten_once_read, run_python, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, KernelCacheWarning, compile_program

SOURCE = r"""#include "val.h"
template <int N> __global__ void k(float* o) { o[threadIdx.x] = VAL * N + o[threadIdx.x + N]; }
"""

# SOURCE with a second or so of NVVM and ptxas after its one header is read (test_headers.SLOW's
# loop), for an edit that lands in the middle of the compile.
SLOW = r"""#include "val.h"
template <int N> __global__ void k(float* o) {
    float x = o[threadIdx.x];
#pragma unroll
    for (int i = 0; i < 40; ++i) x = sinf(x * 1.0001f + i) * cosf(x - i);
    o[threadIdx.x] = x + VAL * N;
}
"""


def compiled(cache, n: int, source: str = SOURCE, **options: object) -> tuple[bytes, CompileInfo]:
    settle_timestamps()  # headers the test wrote just now are older than the compile's start
    info = CompileInfo()
    obj = compile_program(
        source,
        cache=cache,
        info=info,
        options=ProgramOptions(arch=ARCH, **options),
        name_expressions=[f"k<{n}>"],
    )
    return bytes(obj.code), info


def truth(monkeypatch: pytest.MonkeyPatch, n: int, source: str = SOURCE, **options: object) -> bytes:
    """What a compile with no cache at all gives now."""
    with monkeypatch.context() as m:
        m.setenv("KERNELCACHE_DISABLE", "1")
        return compiled(None, n, source, **options)[0]


def hits_in_a_fresh_process(root: str, cwd: str, ns: list[int], **options: object) -> list[bool]:
    """Whether each name expression of SOURCE hits in a new interpreter (nothing of this one's memos)."""
    script = (
        "import os, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        f"os.chdir({cwd!r})\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import CompileInfo, FileStreamProgramCache, compile_program\n"
        f"cache = FileStreamProgramCache({root!r})\n"
        f"for n in {ns!r}:\n"
        "    i = CompileInfo()\n"
        f"    compile_program(sys.argv[1], cache=cache, info=i, name_expressions=[f'k<{{n}}>'],"
        f" options=ProgramOptions(arch={ARCH!r}, **{options!r}))\n"
        "    print(i.hit)\n"
    )
    return [line == "True" for line in run_python(script, SOURCE).split()]


@pytest.fixture
def proj(tmp_path, monkeypatch):
    where = tmp_path / "proj"
    where.mkdir()
    (where / "val.h").write_text("#define VAL 1.0f\n")
    monkeypatch.chdir(where)
    return where


@pytest.mark.parametrize("restrict", [False, True], ids=["here", "in-a-worker"])
def test_later_instantiations_skip_the_pass_and_are_stored_as_a_pass_would_store_them(
    tmp_path, proj, monkeypatch, restrict: bool
) -> None:
    cache = FileStreamProgramCache(tmp_path / "cache")
    extra = {"restrict": True} if restrict else {}
    got = [compiled(cache, n, **extra) for n in (1, 2, 3)]
    assert [info.header_pass for _, info in got] == [True, False, False]
    assert all(info.cached and not info.hit for _, info in got)
    assert [sorted(info.headers) for _, info in got] == [[str(proj / "val.h")]] * 3
    assert [data for data, _ in got] == [truth(monkeypatch, n, **extra) for n in (1, 2, 3)]
    assert hits_in_a_fresh_process(str(tmp_path / "cache"), str(proj), [1, 2, 3], **extra) == [True] * 3


@pytest.mark.parametrize("restrict", [False, True], ids=["here", "in-a-worker"])
def test_a_header_that_now_includes_another_gets_a_pass_and_the_new_header_is_tracked(
    tmp_path, proj, monkeypatch, restrict: bool
) -> None:
    cache = FileStreamProgramCache(tmp_path / "cache")
    extra = {"restrict": True} if restrict else {}
    assert compiled(cache, 1, **extra)[1].header_pass
    (proj / "extra.h").write_text("#define EXTRA 2.0f\n")
    (proj / "val.h").write_text('#include "extra.h"\n#define VAL EXTRA\n')
    data, info = compiled(cache, 2, **extra)
    # The list the first pass made ([val.h]) no longer holds: a pass of its own found extra.h.
    assert info.header_pass and info.cached and not info.hit
    assert sorted(info.headers) == [str(proj / "extra.h"), str(proj / "val.h")]
    assert data == truth(monkeypatch, 2, **extra)
    # extra.h is part of the entry's key: editing it is a miss, never the old kernel.
    (proj / "extra.h").write_text("#define EXTRA 3.0f\n")
    data, info = compiled(cache, 2, **extra)
    assert not info.hit and data == truth(monkeypatch, 2, **extra)


def test_a_new_header_shadowing_the_one_found_gets_a_pass(tmp_path, proj, monkeypatch) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (proj / "val.h").unlink()
    (second / "val.h").write_text("#define VAL 1.0f\n")
    cache = FileStreamProgramCache(tmp_path / "cache")
    paths = {"include_path": [str(first), str(second)]}
    assert compiled(cache, 1, **paths)[1].headers == [str(second / "val.h")]
    (first / "val.h").write_text("#define VAL 5.0f\n")  # earlier on the search path: NVRTC reads this one now
    data, info = compiled(cache, 2, **paths)
    assert info.header_pass and info.cached and info.headers == [str(first / "val.h")]
    assert data == truth(monkeypatch, 2, **paths)
    (first / "val.h").write_text("#define VAL 6.0f\n")
    data, info = compiled(cache, 2, **paths)
    assert not info.hit and data == truth(monkeypatch, 2, **paths)


def test_a_header_edited_during_a_compile_without_a_pass_is_not_stored(tmp_path, proj, monkeypatch) -> None:
    cache = FileStreamProgramCache(tmp_path / "cache")
    assert compiled(cache, 1, SLOW)[1].header_pass
    # The first read of val.h after this point is NVRTC's or the build beside it: either way
    # the edit lands while the compile runs (it has a second of NVVM and ptxas ahead).
    editing = rewritten_once_read(proj / "val.h", "#define VAL 2.0f\n")
    with editing as edited, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data, info = compiled(cache, 2, SLOW)
    assert edited.is_set() and not info.header_pass and not info.hit
    assert not info.cached and "changed during the compile" in info.not_stored
    said = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
    assert len(said) == 1 and "changed during the compile" in said[0]
    assert data in (
        truth(monkeypatch, 2, SLOW.replace('#include "val.h"', "#define VAL 1.0f")),
        truth(monkeypatch, 2, SLOW),
    )
    # Nothing was stored: the next call compiles the header as it is now, and stores that.
    data, info = compiled(cache, 2, SLOW)
    assert not info.hit and info.cached and data == truth(monkeypatch, 2, SLOW)


def compiled_in_a_fresh_process(root: str, cwd: str, n: int, why: bool = False) -> dict[str, object]:
    """compile_program of SOURCE's k<n> in a new interpreter: what its CompileInfo said (``why``:
    its miss_reason too)."""
    script = (
        "import json, os, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        f"os.chdir({cwd!r})\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import CompileInfo, FileStreamProgramCache, compile_program\n"
        "i = CompileInfo()\n"
        f"compile_program(sys.argv[1], cache=FileStreamProgramCache({root!r}), info=i, name_expressions=['k<{n}>'],"
        f" options=ProgramOptions(arch={ARCH!r}))\n"
        "print(json.dumps({'hit': i.hit, 'cached': i.cached, 'header_pass': i.header_pass, 'headers': sorted(i.headers),"
        " 'miss_reason': i.miss_reason}))\n"
    )
    said = json.loads(run_python(script, SOURCE).splitlines()[-1])
    if not why:
        del said["miss_reason"]
    return said


def test_another_process_uses_the_stores_hint_and_notices_what_changed_since(tmp_path, proj) -> None:
    root = str(tmp_path / "cache")
    first = compiled_in_a_fresh_process(root, str(proj), 1)
    assert first["header_pass"] and first["cached"]
    settle_timestamps()
    # Another process, another instantiation: the store's hint names the variant, no pass.
    second = compiled_in_a_fresh_process(root, str(proj), 2)
    assert second == {"hit": False, "cached": True, "header_pass": False, "headers": [str(proj / "val.h")]}
    # The header now includes another: the hint no longer holds, a pass finds both.
    (proj / "extra.h").write_text("#define EXTRA 2.0f\n")
    (proj / "val.h").write_text('#include "extra.h"\n#define VAL EXTRA\n')
    settle_timestamps()
    third = compiled_in_a_fresh_process(root, str(proj), 3)
    assert third == {
        "hit": False,
        "cached": True,
        "header_pass": True,
        "headers": [str(proj / "extra.h"), str(proj / "val.h")],
    }
    assert hits_in_a_fresh_process(root, str(proj), [1, 2, 3]) == [False, False, True]  # 1, 2 read the old val.h


def test_a_store_filled_without_a_pass_still_gets_the_hint(tmp_path, proj) -> None:
    # This process traced k<1> into one store; its compile into a second store needs no pass,
    # and must still leave that store the hint, for the second store's other processes.
    first, second = FileStreamProgramCache(tmp_path / "first"), FileStreamProgramCache(tmp_path / "second")
    assert compiled(first, 1)[1].header_pass
    assert not compiled(second, 1)[1].header_pass
    got = compiled_in_a_fresh_process(str(tmp_path / "second"), str(proj), 2)
    assert got == {"hit": False, "cached": True, "header_pass": False, "headers": [str(proj / "val.h")]}


def test_a_name_expression_that_probes_a_header_is_tracked(tmp_path, proj, monkeypatch) -> None:
    # NVRTC compiles name expressions as C++: __has_include is allowed there, and creating the
    # file it names changes the kernel (k<0> -> k<1>). Found by an adversarial pass: the scan read
    # the source alone, and the k<0> entry stayed a hit after opt.h was created.
    source = "template <int N> __global__ void k(float* o) { o[threadIdx.x] = N; }\n"
    cache = FileStreamProgramCache(tmp_path / "cache")
    names = ['k<__has_include("opt.h")>']

    def run() -> tuple[bytes, CompileInfo]:
        settle_timestamps()
        info = CompileInfo()
        obj = compile_program(source, cache=cache, info=info, options=ProgramOptions(arch=ARCH), name_expressions=names)
        return bytes(obj.code), info

    first, info = run()
    assert info.cached and not info.hit
    assert run()[1].hit
    (proj / "opt.h").write_text("\n")
    data, info = run()
    assert not info.hit
    with monkeypatch.context() as m:
        m.setenv("KERNELCACHE_DISABLE", "1")
        assert data == run()[0] != first


def test_a_header_reached_by_a_computed_include_always_gets_a_pass(tmp_path, proj, monkeypatch) -> None:
    # A name spelled by the preprocessor (stringized here, no literal anywhere): no probe says
    # where NVRTC looked before the header it found, so no check after the compile could see a
    # file created there meanwhile. Such a preprocessing is never reused.
    spelled = "#define STR(x) #x\n#define XSTR(x) STR(x)\n#define NAME val\n#include XSTR(NAME.h)"
    source = SOURCE.replace('#include "val.h"', spelled)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 3.0f\n")
    cache = FileStreamProgramCache(tmp_path / "cache")
    got = [compiled(cache, n, source, include_path=[str(inc)]) for n in (1, 2)]
    assert [info.header_pass for _, info in got] == [True, True]
    assert all(info.cached for _, info in got)
    assert [data for data, _ in got] == [truth(monkeypatch, n, source, include_path=[str(inc)]) for n in (1, 2)]


def _variant_record(cache: FileStreamProgramCache, n: int) -> str:
    """The path of the record of the header variant k<n>'s entry was stored under."""
    from kernelcache.compile.lookup import Lookup
    from kernelcache.compile.request import CompileRequest
    from kernelcache.headers import manifests
    from kernelcache.stores.naming import entry_name

    request = CompileRequest.of(SOURCE, "c++", "cubin", ProgramOptions(arch=ARCH), [f"k<{n}>"], None)
    _, record, variant = Lookup(cache, request).find()
    assert record is not None and variant is not None
    return cache.entry_path(entry_name(manifests.variant_key(variant["digest"])))


def test_a_variant_record_the_store_holds_is_not_written_again_and_one_gone_is(tmp_path, proj) -> None:
    """Instantiations of one template share one header variant: the misses after the first
    leave its record as it is (the same file, the same inode), and one removed meanwhile (as
    eviction or ``kernelcache rm`` would) is written again, so every instantiation still hits
    in a fresh process."""
    import os

    cache = FileStreamProgramCache(tmp_path / "cache")
    compiled(cache, 1)
    path = _variant_record(cache, 1)
    first = os.stat(path).st_ino
    assert not compiled(cache, 2)[1].header_pass
    assert _variant_record(cache, 2) == path and os.stat(path).st_ino == first  # not rewritten
    os.unlink(path)
    _, info = compiled(cache, 3)
    assert info.cached and os.path.exists(path)
    assert hits_in_a_fresh_process(str(tmp_path / "cache"), str(proj), [1, 2, 3]) == [True] * 3


def test_a_miss_whose_variant_record_is_gone_says_so_not_that_the_entry_is(tmp_path, proj) -> None:
    """The entry is still stored but the record of the headers it read is gone (evicted, or
    removed by hand): the look-up cannot vouch for the entry, and the miss's explanation names
    the record, not a vanished entry; the compile writes the record again."""
    import os

    root = str(tmp_path / "cache")
    cache = FileStreamProgramCache(root)
    compiled(cache, 1)
    os.unlink(_variant_record(cache, 1))
    again = compiled_in_a_fresh_process(root, str(proj), 1, why=True)  # no memo of this process's
    assert not again["hit"] and again["cached"]
    assert "record of the headers" in again["miss_reason"], again["miss_reason"]
    assert "no longer in the store" not in again["miss_reason"]
    assert hits_in_a_fresh_process(root, str(proj), [1]) == [True]


def test_a_variant_record_is_written_again_where_only_a_write_keeps_it(tmp_path, proj, server) -> None:
    """Where records live by their last write, the shared record must outlive the newest entry
    that needs it: each miss writes it again. Redis with a ttl: the record's expiry moves with
    the second instantiation's (a real server); a file cache with touch_on_read=False (reads
    leave the eviction order alone): a new file."""
    import os

    import redis

    from kernelcache import RedisProgramCache
    from kernelcache.compile.lookup import Lookup
    from kernelcache.compile.request import CompileRequest
    from kernelcache.headers import manifests

    rc = RedisProgramCache(server.url, namespace=f"vttl{os.getpid()}", ttl=600)
    compiled(rc, 1)
    request = CompileRequest.of(SOURCE, "c++", "cubin", ProgramOptions(arch=ARCH), ["k<1>"], None)
    variant = Lookup(rc, request).find()[2]
    assert variant is not None
    record = rc._entry_key(manifests.variant_key(variant["digest"]))
    client = redis.Redis.from_url(server.url)
    before = client.pttl(record)
    assert 0 < before <= 600_000
    compiled(rc, 2)  # a compile of tens of milliseconds at least: the ttl would have moved on
    assert client.pttl(record) > before

    cache = FileStreamProgramCache(tmp_path / "untouched", touch_on_read=False)
    compiled(cache, 1)
    path = _variant_record(cache, 1)
    first = os.stat(path).st_ino
    compiled(cache, 2)
    assert os.stat(path).st_ino != first
