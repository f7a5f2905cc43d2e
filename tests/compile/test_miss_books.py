"""A miss's bookkeeping beside its compile (compile.strict.MissBooks): counted and explained as
before, and the source's index names only entries that were stored (a compile that fails, is
refused by the store, or whose process is killed leaves no key). Real NVRTC compiles, real files."""

from __future__ import annotations

import json

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
from kernelcache.compile.lookup import Lookup
from kernelcache.compile.request import CompileRequest
from kernelcache.compile.sourceindex import index_key

# Compiles for every arch but sm_80: one source whose compile fails under one option set only.
SRC = """
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
#error "not for sm_80"
#endif
extern "C" __global__ void fill(float* a) { a[threadIdx.x] = 1.0f; }
"""


def _index(cache: FileStreamProgramCache, code: str = SRC) -> list[dict]:
    record = cache.get_record(index_key(Lookup(cache, CompileRequest.of(code, options=ProgramOptions(arch=ARCH)))), internal=True)
    return [] if record is None else json.loads(record[0])["entries"]


def test_a_failed_compile_is_counted_explained_and_leaves_the_index_as_it_was(tmp_path) -> None:
    from cuda.core._utils.cuda_utils import NVRTCError

    cache = FileStreamProgramCache(tmp_path)
    good = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=cache, info=good)
    assert [e["key"] for e in _index(cache)] == [good.key.hex()]

    failed = CompileInfo()
    with pytest.raises(NVRTCError, match="not for sm_80"):
        compile_program(SRC, options=ProgramOptions(arch="sm_80"), cache=cache, info=failed)
    # Nothing of the failed compile is in the index.
    assert [e["key"] for e in _index(cache)] == [good.key.hex()]
    assert failed.miss_reason is not None and "differs in options.arch" in failed.miss_reason
    stats = cache.stats()
    assert (stats["misses"], stats["compiles"], stats["stores"]) == (2, 1, 1)

    # A later miss is explained against what is stored, never against the failed compile.
    later = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch="sm_86"), cache=cache, info=later)
    assert later.miss_reason is not None and f"cached '{ARCH}', this call 'sm_86'" in later.miss_reason, later.miss_reason
    assert [e["key"] for e in _index(cache)] == [later.key.hex(), good.key.hex()]


def test_a_failed_first_compile_of_a_source_leaves_no_index(tmp_path) -> None:
    from cuda.core._utils.cuda_utils import NVRTCError

    cache = FileStreamProgramCache(tmp_path)
    with pytest.raises(NVRTCError):
        compile_program(SRC, options=ProgramOptions(arch="sm_80"), cache=cache)
    assert _index(cache) == [] and len(cache) == 0
    assert cache.stats()["misses"] == 1
    info = CompileInfo()
    compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=cache, info=info)
    assert info.miss_reason == "no entry for this source"


def test_a_tracked_miss_is_indexed_after_its_compile_as_before(tmp_path) -> None:
    # A source that may read headers: its key depends on them, so it is indexed once stored.
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "v.h").write_text("#define V 2\n")
    settle_timestamps()
    code = '#include "v.h"\n' + SRC
    cache = FileStreamProgramCache(tmp_path / "c")
    infos = []
    for arch in (ARCH, "sm_86"):
        infos.append(CompileInfo())
        options = ProgramOptions(arch=arch, include_path=[str(tmp_path / "inc")])
        compile_program(code, options=options, cache=cache, info=infos[-1])
        assert infos[-1].cached, infos[-1].not_stored
    look = Lookup(cache, CompileRequest.of(code, options=ProgramOptions(arch=ARCH)))
    entries = json.loads(cache.get_record(index_key(look), internal=True)[0])["entries"]
    assert [e["key"] for e in entries] == [infos[1].key.hex(), infos[0].key.hex()]
    assert "differs in options.arch" in (infos[1].miss_reason or "")


def test_a_compile_returned_but_not_stored_leaves_no_key_in_the_index(tmp_path, monkeypatch) -> None:
    # No #include: untracked, its key known before the compile. __FILE__ names the
    # KERNELCACHE_BASE_DIR in the artifact: returned, not stored (keys.basedir), never indexed.
    base = tmp_path / "proj"
    base.mkdir()
    monkeypatch.setenv("KERNELCACHE_BASE_DIR", str(base))
    code = 'extern "C" __global__ void w(const char** p) { *p = __FILE__; }\n'
    options = ProgramOptions(arch=ARCH, name=str(base / "k.cu"))
    cache = FileStreamProgramCache(tmp_path / "c")
    info = CompileInfo()
    with pytest.warns(Warning, match="KERNELCACHE_BASE_DIR"):
        compile_program(code, options=options, cache=cache, info=info)
    assert not info.cached and info.not_stored and info.miss_reason == "no entry for this source"
    look = Lookup(cache, CompileRequest.of(code, options=options))
    assert cache.get_record(index_key(look), internal=True) is None and len(cache) == 0


def test_a_miss_interrupted_before_its_compile_started_is_counted_and_explained(tmp_path) -> None:
    # The bookkeeping is handed to a thread only once the compiler takes over (MissBooks.start);
    # a call interrupted before that (here: Ctrl-C while it waits for one of the node's compile
    # slots, all held by this process) still counts and explains its miss, and indexes nothing.
    import os
    import signal
    import subprocess
    import sys
    import time

    from kernelcache.runners import slots

    held = list(iter(slots.try_take, None))
    assert len(held) == slots.usable_cores()
    child = (
        "import json, sys\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import CompileInfo, FileStreamProgramCache, compile_program\n"
        "cache, info = FileStreamProgramCache(sys.argv[1]), CompileInfo()\n"
        "try:\n"
        f"    compile_program({SRC!r}, options=ProgramOptions(arch={ARCH!r}), cache=cache, info=info)\n"
        "except KeyboardInterrupt:\n"
        "    s = cache.stats()\n"
        "    print(json.dumps([s['misses'], s['compiles'], len(cache), info.miss_reason]))\n"
    )
    kid = subprocess.Popen([sys.executable, "-c", child, str(tmp_path / "c")], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not slots.others_wait():  # it waits for a slot: its compile has not started
            assert kid.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        kid.send_signal(signal.SIGINT)
        out, _ = kid.communicate(timeout=60)
    finally:
        kid.kill()
        for slot in held:
            slot.release()
    assert json.loads(out) == [1, 0, 0, "no entry for this source"]
    cache = FileStreamProgramCache(tmp_path / "c")
    assert _index(cache) == [] and os.listdir(tmp_path / "c" / "v2" / "entries") == []


def test_an_entry_the_store_refuses_is_not_indexed(tmp_path) -> None:
    # Larger than the store's cap: the write is dropped (warned), so no key may name it, and the
    # next miss is explained as what it is, not as an entry "no longer in the store".
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=1000)
    info = CompileInfo()
    with pytest.warns(Warning, match="exceeds max_size_bytes"):
        compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=cache, info=info)
    assert not info.cached and _index(cache) == []
    again = CompileInfo()
    with pytest.warns(Warning, match="exceeds max_size_bytes"):
        compile_program(SRC, options=ProgramOptions(arch=ARCH), cache=FileStreamProgramCache(tmp_path, max_size_bytes=1000), info=again)
    assert again.miss_reason == "no entry for this source"


# No #include (untracked: its key is known before the compile) and slow: seconds of NVRTC.
SLOW = "".join(
    f"""
extern "C" __global__ void slow{j}(float* a) {{
  float x = a[threadIdx.x];
#pragma unroll
  for (int i = 0; i < 2000; ++i) x = __sinf(x * {j + 1}.5f + i) * x + __cosf(x + i);
  a[threadIdx.x] = x;
}}
"""
    for j in range(8)
)


def test_a_process_killed_during_its_compile_leaves_no_key_in_the_index(tmp_path) -> None:
    # Killed (the OOM killer, a scheduler, kill -9) while NVRTC compiles: nothing runs after. An
    # index written beside the compile kept a key with no entry for good, and later misses of
    # the source were explained against a compile that never finished.
    import signal
    import subprocess
    import sys
    import time

    child = (
        "import sys\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import FileStreamProgramCache, compile_program\n"
        "cache = FileStreamProgramCache(sys.argv[1])\n"
        "print('compiling', flush=True)\n"
        f"compile_program({SLOW!r}, options=ProgramOptions(arch={ARCH!r}), cache=cache)\n"
    )
    kid = subprocess.Popen([sys.executable, "-c", child, str(tmp_path / "c")], stdout=subprocess.PIPE, text=True)
    try:
        assert kid.stdout is not None and kid.stdout.readline() == "compiling\n"
        time.sleep(1.0)  # the bookkeeping beside the compile has run by now; the compile (~4 s) has not
        assert kid.poll() is None
        kid.send_signal(signal.SIGKILL)
        kid.wait(timeout=60)
    finally:
        kid.kill()
        kid.wait()
        if kid.stdout is not None:
            kid.stdout.close()
    cache = FileStreamProgramCache(tmp_path / "c")
    assert len(cache) == 0 and _index(cache, SLOW) == []
