"""compile_many with the real NVRTC: order, hits first, threads, failures, processes sharing a dir."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import _batch_workers as bw
import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps
from sources import HEAVY, TEMPLATE, needs_bundled_headers

from kernelcache import (
    CompileInfo,
    CompileManyError,
    FileStreamProgramCache,
    InMemoryProgramCache,
    compile_many,
    compile_program,
)
from kernelcache.compile.flow import probe

BROKEN = 'extern "C" __global__ void broken(float* a) { a[threadIdx.x] = undefined_name; }\n'


def requests(count: int, **extra: object) -> list[dict[str, object]]:
    return [{"code": bw.variant(i), "options": ProgramOptions(arch=ARCH), **extra} for i in range(count)]


class ThreadsStarted:
    """Names of the threads started while this is active (threading's profile hook, set in
    every thread that threading starts; it observes, it changes nothing)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def _hook(self, frame: object, event: str, arg: object) -> None:
        name = threading.current_thread().name
        if name.startswith("kernelcache-"):  # not the interpreter's or a library's own threads
            self.names.add(name)

    def compilers(self) -> set[str]:
        return {name for name in self.names if name.startswith("kernelcache-compile")}

    def __enter__(self) -> ThreadsStarted:
        threading.setprofile(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]


def test_results_in_request_order_equal_to_one_by_one_compiles(tmp_path) -> None:
    reqs = requests(6)
    reqs.append({"code": TEMPLATE, "options": ProgramOptions(arch=ARCH), "name_expressions": ("axpy<float>",)})
    batch = compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "batch"), max_workers=3)
    alone = FileStreamProgramCache(tmp_path / "alone")
    for request, obj in zip(reqs, batch):
        truth = compile_program(request.pop("code"), cache=alone, **request)  # type: ignore[arg-type]
        assert bytes(obj.code) == bytes(truth.code)
        assert obj.symbol_mapping == truth.symbol_mapping
    assert "axpy<float>" in batch[-1].symbol_mapping


def test_hits_are_looked_up_first_and_an_all_hit_batch_starts_no_thread(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    reqs = requests(5)
    # The batch's own compile threads; the kept threads of the work beside each compile
    # (runners.beside: "kernelcache-beside") are a pool of their own, shared by every call.
    with ThreadsStarted() as started:
        compile_many(reqs[:2], cache=cache, max_workers=8)
    assert len(started.compilers()) == 1, started.names  # 2 misses: this thread and one more, never 8
    with ThreadsStarted() as started:
        compile_many(reqs, cache=cache, max_workers=8)
    assert len(started.compilers()) == 2, started.names  # 3 misses: this thread and two more
    before = cache.stats()
    with ThreadsStarted() as started:
        compile_many(reqs, cache=cache, max_workers=8)
    assert started.names == set()
    after = cache.stats()
    assert (after["hits"] - before["hits"], after["compiles"] - before["compiles"]) == (5, 0)


def test_a_failing_request_raises_after_the_others_were_stored(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    reqs = requests(4)
    reqs.insert(2, {"code": BROKEN, "options": ProgramOptions(arch=ARCH)})
    with pytest.raises(CompileManyError) as caught:
        compile_many(reqs, cache=cache, max_workers=2)
    err = caught.value
    assert list(err.errors) == [2]
    assert "undefined_name" in str(err.errors[2])
    assert "request #2" in str(err)
    assert [r is None for r in err.results] == [False, False, True, False, False]
    assert cache.stats()["compiles"] == 4
    infos = [probe(r["code"], options=r["options"], cache=cache) for r in reqs]  # type: ignore[arg-type]
    assert [i.hit for i in infos] == [True, True, False, True, True]
    import pickle

    again = pickle.loads(pickle.dumps(CompileManyError({1: ValueError("x")}, [b"a", None])))
    assert again.errors[1].args == ("x",) and again.results == [b"a", None]


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"code": "x", "name": "k"}, TypeError),  # name is get_kernels' field, not compile_many's
        ({"options": None}, TypeError),  # no code
        ("extern", TypeError),  # not a mapping
        ({"code": "x", "code_type": "fortran", "options": ProgramOptions(arch=ARCH)}, ValueError),
        ({"code": "x", "options": "sm_90"}, TypeError),
    ],
)
def test_wrong_arguments_raise_at_once_naming_the_request(tmp_path, bad, error) -> None:
    cache = FileStreamProgramCache(tmp_path)
    with pytest.raises(error, match="request #1"):
        compile_many([requests(1)[0], bad], cache=cache)
    assert cache.stats()["compiles"] == 0  # nothing compiled before the error


def test_bad_max_workers_and_bad_cache_raise() -> None:
    with pytest.raises(ValueError, match="max_workers"):
        compile_many(requests(1), max_workers=0)
    with pytest.raises(TypeError, match="cache must be"):
        compile_many(requests(1), cache={})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sequence of mappings"):
        compile_many(requests(1)[0])  # type: ignore[arg-type]
    assert compile_many([]) == []


def test_duplicate_requests_compile_once(tmp_path) -> None:
    cache = InMemoryProgramCache()
    out = compile_many(requests(1) * 6, cache=cache, max_workers=4)
    assert len({bytes(o.code) for o in out}) == 1
    s = cache.stats()
    assert (s["compiles"], s["hits"]) == (1, 5)


def test_disabled_compiles_everything_and_stores_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    cache = FileStreamProgramCache(tmp_path)
    out = compile_many(requests(3), cache=cache, max_workers=2)
    assert all(bytes(o.code)[:4] == b"\x7fELF" for o in out)
    assert cache.stats()["stores"] == 0


def test_headers_are_tracked_per_request_when_compiled_on_threads(tmp_path) -> None:
    # The trace NVRTC writes (-fdevice-time-trace) is per compile even when compiles run on
    # several threads at once: each entry lists its own header, and only the edited one misses.
    cache = FileStreamProgramCache(tmp_path / "cache")
    reqs = []
    for i in range(4):
        inc = tmp_path / f"inc{i}"
        inc.mkdir()
        (inc / f"h{i}.h").write_text(f"#define VALUE{i} {i}.0f\n")
        code = f'#include "h{i}.h"\nextern "C" __global__ void k{i}(float* a) {{ a[0] = VALUE{i}; }}\n'
        reqs.append({"code": code, "options": ProgramOptions(arch=ARCH, include_path=[str(inc)])})
    settle_timestamps()  # the headers written just now are older than the compiles' start (else not stored)
    compile_many(reqs, cache=cache, max_workers=4)
    for i, r in enumerate(reqs):
        info = CompileInfo()
        compile_program(r["code"], options=r["options"], cache=cache, info=info)  # type: ignore[arg-type]
        assert info.hit and [os.path.basename(h) for h in info.headers] == [f"h{i}.h"]
    (tmp_path / "inc2" / "h2.h").write_text("#define VALUE2 22.0f\n")
    hits = [probe(r["code"], options=r["options"], cache=cache).hit for r in reqs]  # type: ignore[arg-type]
    assert hits == [True, True, False, True]


@pytest.mark.parametrize(
    ("processes", "kernels"), [(False, 8), (True, 8), (None, 16)], ids=["threads", "workers", "default"]
)
def test_processes_sharing_a_dir_compile_each_key_exactly_once(tmp_path, processes, kernels) -> None:
    procs = 4
    root, gate = str(tmp_path / "cache"), str(tmp_path / "gate")  # each waits at the gate until all imported cuda.core
    ctx = mp.get_context("spawn")
    with ctx.Pool(procs) as pool:  # one task per pool process: each blocks at the gate until all arrive
        results = pool.starmap(bw.compile_variants, [(root, ARCH, kernels, gate, procs, processes)] * procs, chunksize=1)
    assert all(r == results[0] for r in results)  # everyone got the same bytes, in order
    s = FileStreamProgramCache(root).stats()
    assert (s["compiles"], s["misses"], s["hits"]) == (kernels, kernels, procs * kernels - kernels)


def test_hosts_sharing_redis_compile_each_key_exactly_once(tmp_path) -> None:
    # Each "host" has its own memory and disk tiers; they meet only in Redis. A key another
    # host holds is put aside (the Redis lock's "timeout" on a non-blocking try) and found
    # published later.
    from redis_servers import RedisServer, need_redis

    need_redis()
    server = RedisServer(str(tmp_path / "redis"))
    try:
        kernels, ns = 6, f"many{time.time_ns()}"
        gate = str(tmp_path / "gate")
        with mp.get_context("spawn").Pool(2) as pool:
            compiles = pool.starmap(
                bw.host_compile_many,
                [(str(tmp_path / host), server.url, ns, kernels, gate, 2, ARCH) for host in ("host1", "host2")],
                chunksize=1,
            )
    finally:
        server.stop()
    assert sum(compiles) == kernels, f"compiles per host: {compiles}"


def _held_lock(lock_dir: str) -> bool:
    import fcntl

    for name in os.listdir(lock_dir) if os.path.isdir(lock_dir) else ():
        with open(os.path.join(lock_dir, name), "rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    return False


def _wait_until_a_peer_holds_a_lock(cache: FileStreamProgramCache, peer: mp.process.BaseProcess) -> None:
    lock_dir = os.path.dirname(cache.lock_path("probe"))
    deadline = time.monotonic() + 120
    while not _held_lock(lock_dir):
        assert peer.is_alive() and time.monotonic() < deadline, "the peer never took its lock"
        time.sleep(0.01)


@needs_bundled_headers
def test_keys_a_peer_compiles_are_taken_last_and_found_published(tmp_path) -> None:
    # A real peer process compiles the slow CUB kernel; this process's batch holds it and
    # two small kernels: it compiles the small ones, then finds the slow one published.
    cache = FileStreamProgramCache(tmp_path)
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    peer = ctx.Process(target=bw.compile_one_held, args=(str(tmp_path), HEAVY, ARCH, started))
    peer.start()
    _wait_until_a_peer_holds_a_lock(cache, peer)
    heavy = {"code": HEAVY, "options": ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17")}
    out = compile_many([heavy, *requests(2)], cache=cache, max_workers=1)
    peer.join(60)
    assert peer.exitcode == 0
    s = cache.stats()
    assert (s["compiles"], s["hits"]) == (3, 1)  # the CUB kernel was compiled once, by the peer
    assert bytes(out[0].code)[:4] == b"\x7fELF"


@needs_bundled_headers
def test_a_key_whose_peer_died_is_compiled_here(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    peer = ctx.Process(target=bw.compile_one_held, args=(str(tmp_path), HEAVY, ARCH, started))
    peer.start()
    _wait_until_a_peer_holds_a_lock(cache, peer)
    heavy = {"code": HEAVY, "options": ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17")}
    killer = threading.Timer(0.5, os.kill, (peer.pid, signal.SIGKILL))  # dies mid-compile
    killer.start()
    out = compile_many([heavy], cache=cache)
    killer.join()
    peer.join(10)
    assert peer.exitcode == -signal.SIGKILL
    assert bytes(out[0].code)[:4] == b"\x7fELF"
    assert cache.stats()["compiles"] == 1  # ours: the peer died before storing anything


def test_warm_compiles_through_compile_many_and_an_all_hit_manifest_starts_no_thread(tmp_path) -> None:
    import json

    from kernelcache.cli import warm

    manifest = tmp_path / "m.json"
    kernels = [{"name": f"k{i}", "code": bw.variant(i)} for i in range(3)]
    kernels.append({"name": "broken", "code": BROKEN})
    kernels.append({"name": "badopt", "code": bw.variant(9), "options": {"no_such_option": 1}})
    manifest.write_text(json.dumps({"defaults": {"arch": ARCH}, "kernel": kernels}))
    items = warm.load_manifest(str(manifest))
    cache_dir = str(tmp_path / "cache")
    first = warm.run(items, cache_dir, 8, progress=False)
    assert [r["name"] for r in first] == ["k0", "k1", "k2", "broken", "badopt"]
    assert [r.get("error", "")[:12] for r in first] == ["", "", "", "NVRTCError: ", "ValueError: "]
    assert [r["hit"] for r in first] == [False] * 5
    assert FileStreamProgramCache(cache_dir).stats()["compiles"] == 3
    with ThreadsStarted() as started:
        again = warm.run(items[:3], cache_dir, 8, progress=False)
    assert started.names == set()  # all hits: no worker at all, whatever -j says
    assert [r["hit"] for r in again] == [True] * 3
    assert [r["key"] for r in again] == [r["key"] for r in first[:3]]


def test_misses_are_taken_one_source_at_a_time(tmp_path) -> None:
    # Two templates (each reads a header: tracked), instantiated three and two times, and one
    # plain kernel, in request order A A A B B k: taken A B k A B A, so that takers starting
    # together start different preprocessings (each one's first compile runs its header pass).
    from kernelcache.compile.batch import run_batch

    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "t.h").write_text("template <typename T> __device__ T twice(T x) { return x + x; }\n")
    settle_timestamps()
    options = ProgramOptions(arch=ARCH, include_path=[str(tmp_path / "inc")])
    a = '#include "t.h"\ntemplate <typename T> __global__ void a(T* p) { p[0] = twice(p[0]); }\n'
    b = '#include "t.h"\ntemplate <typename T> __global__ void b(T* p) { p[1] = twice(p[1]); }\n'
    reqs = [{"code": a, "options": options, "name_expressions": (f"a<{t}>",)} for t in ("int", "float", "double")]
    reqs += [{"code": b, "options": options, "name_expressions": (f"b<{t}>",)} for t in ("int", "float")]
    reqs.append({"code": bw.variant(0), "options": ProgramOptions(arch=ARCH)})
    taken: list[int] = []
    batch = run_batch(reqs, FileStreamProgramCache(tmp_path / "c"), 1, on_done=taken.append, processes=False)
    assert not batch.errors and taken == [0, 3, 5, 1, 4, 2]
    assert [bool(info.header_pass) for info in batch.infos] == [True, False, False, True, False, False]
