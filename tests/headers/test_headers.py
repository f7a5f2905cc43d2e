"""Never a wrong kernel through headers: races with edits, and what the header trace cannot see.

Each test compares compile_program's result with the truth (the same compile with
KERNELCACHE_DISABLE=1) after a real change on disk: real NVRTC, real files, real threads and
processes, real filesystems with coarse timestamps.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator

import _fswatch
import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, SUPPORT, rewritten_once_read, run_python, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, KernelCacheWarning, compile_program
from kernelcache.headers import digests as hdr

TESTS = SUPPORT  # the children import _fswatch from there


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child started in another directory: PYTHONPATH made absolute."""
    path = os.pathsep.join(os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def opts(**kw: object) -> ProgramOptions:
    return ProgramOptions(arch=ARCH, **kw)


def compiled(cache, code: str, **kw) -> tuple[bytes, CompileInfo]:
    settle_timestamps()  # headers the test wrote just now are older than the compile's start
    info = CompileInfo()
    kw.setdefault("options", opts())
    obj = compile_program(code, cache=cache, info=info, **kw)
    return bytes(obj.code), info


def truth(code: str, monkeypatch: pytest.MonkeyPatch, **kw) -> bytes:
    """What a fresh compile produces now, with no cache at all."""
    with monkeypatch.context() as m:
        m.setenv("KERNELCACHE_DISABLE", "1")
        return compiled(None, code, **kw)[0]


# A compile that reads its one header at once (within ~30 ms), then spends about a second in NVVM
# and ptxas (measured beside other work on 2 cores: header read to compile end 1.2-1.3 s), while
# the thread a test wakes on that read needs a millisecond to act. 80 iterations took 3 s a
# compile, and the race tests compile it 3-4 times each.
SLOW = r"""#include "val.h"
extern "C" __global__ void slow(float* o) {
    float x = o[threadIdx.x];
#pragma unroll
    for (int i = 0; i < 40; ++i) x = sinf(x * 1.0001f + i) * cosf(x - i);
    o[threadIdx.x] = x + VAL;
}
"""


def fresh_process_compile(root: str, code: str, cwd: str, include_path: list[str] | None = None) -> tuple[bool, str]:
    """compile_program in a new interpreter (no memo of this one): (hit, sha256 of the artifact)."""
    script = (
        "import hashlib, sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import CompileInfo, FileStreamProgramCache, compile_program\n"
        "i = CompileInfo()\n"
        f"o = compile_program(sys.argv[1], cache=FileStreamProgramCache({root!r}), info=i,"
        f" options=ProgramOptions(arch={ARCH!r}, include_path={include_path!r}))\n"
        "print(i.hit, hashlib.sha256(bytes(o.code)).hexdigest())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, code],
        cwd=cwd,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    hit, digest = proc.stdout.split()
    return hit == "True", digest


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- a header edited while the compile runs --------------------------------------------------


def test_header_edited_during_the_compile_is_not_stored(tmp_path, monkeypatch) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    val = proj / "val.h"
    val.write_text("#define VAL 1.0f\n")
    monkeypatch.chdir(proj)
    cache = FileStreamProgramCache(tmp_path / "cache")
    # The moment NVRTC has read val.h (and closed it), rewrite it: the compile still has seconds
    # of NVVM and ptxas ahead, so the edit lands in the middle of it.
    editing = rewritten_once_read(val, "#define VAL 2.0f\n")
    with editing as edited, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old, info = compiled(cache, SLOW)
    assert edited.is_set() and not info.hit
    # The first close of val.h may be the header pass's, beside the compile in another process
    # (runners/beside.py): the compile then read one text or the other. Either way it is returned,
    # and the check below says it was not stored.
    before = truth(SLOW.replace('#include "val.h"', "#define VAL 1.0f"), monkeypatch)
    assert old in (before, truth(SLOW, monkeypatch))
    # A fresh process (no memo) must compile the new header, not load the old artifact.
    hit, digest = fresh_process_compile(str(tmp_path / "cache"), SLOW, str(proj))
    assert (hit, digest) == (False, sha(truth(SLOW, monkeypatch)))
    # The caller got its result with exactly one warning saying why it was not stored.
    said = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
    assert len(said) == 1 and "changed during the compile" in said[0]
    assert cache.stats()["errors_by_cause"] == {"not_stored": 1}


def test_header_touched_after_the_compile_started_is_not_stored(tmp_path, monkeypatch) -> None:
    # ccache's rule: a header whose mtime is at or after the compile's start may have been
    # read before or after the change; the result is not stored, even when the bytes are equal.
    proj = tmp_path / "proj"
    proj.mkdir()
    val = proj / "val.h"
    val.write_text("#define VAL 1.0f\n")
    monkeypatch.chdir(proj)
    cache = FileStreamProgramCache(tmp_path / "cache")
    watch = _fswatch.Watch()
    watch.add(str(val), _fswatch.IN_CLOSE_NOWRITE)
    editor = threading.Thread(target=lambda: watch.events(120) and val.write_text("#define VAL 1.0f\n"))
    editor.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled(cache, SLOW)
    finally:
        editor.join(150)
        watch.close()
    assert compiled(cache, SLOW)[1].hit is False  # nothing was stored by the racy compile
    assert compiled(cache, SLOW)[1].hit is True  # the quiet one was


def test_a_probed_header_created_during_the_compile_is_not_stored(tmp_path, monkeypatch) -> None:
    # NVRTC evaluates __has_include("opt.h") (false), then reads val.h; opt.h appears while
    # it optimizes. Resolving the probe after the compile would record "found" for a
    # compile that ran without opt.h: it must not be stored.
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "val.h").write_text("#define VAL 1.0f\n")
    probe = '#if __has_include("opt.h")\n#include "opt.h"\n#else\n#define OPT 0.0f\n#endif\n'
    code = probe + SLOW.replace("x + VAL;", "x + VAL + OPT;")
    monkeypatch.chdir(proj)
    cache = FileStreamProgramCache(tmp_path / "cache")
    watch = _fswatch.Watch()
    watch.add(str(proj / "val.h"), _fswatch.IN_CLOSE_NOWRITE)
    creator = threading.Thread(target=lambda: watch.events(120) and (proj / "opt.h").write_text("#define OPT 1.0f\n"))
    creator.start()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(cache, code)
    finally:
        creator.join(150)
        watch.close()
    assert (proj / "opt.h").exists()
    hit, digest = fresh_process_compile(str(tmp_path / "cache"), code, str(proj))
    assert (hit, digest) == (False, sha(truth(code, monkeypatch)))
    assert any("changed during the compile" in str(w.message) for w in caught)


# -- what the trace cannot see -----------------------------------------------------------------


HAS_INCLUDE = r"""
#if __has_include("opt.h")
#include "opt.h"
#else
#define OPT 0
#endif
extern "C" __global__ void k(int* x) { *x = OPT; }
"""


def test_has_include_of_a_header_created_later_is_a_miss(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, _ = compiled(cache, HAS_INCLUDE)
    assert compiled(cache, HAS_INCLUDE)[1].hit  # probing is no reason to refuse caching
    (tmp_path / "opt.h").write_text("#define OPT 7\n")
    after, info = compiled(cache, HAS_INCLUDE)
    assert not info.hit and after == truth(HAS_INCLUDE, monkeypatch) != before
    (tmp_path / "opt.h").unlink()  # and back: the old variant is right again
    again, info = compiled(cache, HAS_INCLUDE)
    assert info.hit and again == before


def test_has_include_inside_a_header_and_angle_probes_are_tracked(tmp_path, monkeypatch) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (tmp_path / "cfg.h").write_text(
        "#if __has_include(<extra.h>)\n#include <extra.h>\n#else\n#define EXTRA 0\n#endif\n"
    )
    code = '#include "cfg.h"\nextern "C" __global__ void k(int* x) { *x = EXTRA; }\n'
    monkeypatch.chdir(tmp_path)
    options = opts(include_path=[str(inc)])
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, _ = compiled(cache, code, options=options)
    (inc / "extra.h").write_text("#define EXTRA 5\n")
    after, info = compiled(cache, code, options=options)
    assert not info.hit and after == truth(code, monkeypatch, options=options) != before


def test_quoted_include_searches_the_including_headers_directory_first(tmp_path, monkeypatch) -> None:
    # inc/sub/a.h has #include "b.h", found as inc/b.h through include_path; a new
    # inc/sub/b.h is searched first (the includer's own directory) and wins.
    (tmp_path / "inc" / "sub").mkdir(parents=True)
    (tmp_path / "inc" / "sub" / "a.h").write_text('#pragma once\n#include "b.h"\n')
    (tmp_path / "inc" / "b.h").write_text("#define B 2\n")
    code = '#include "sub/a.h"\nextern "C" __global__ void k(int* x) { *x = B; }\n'
    monkeypatch.chdir(tmp_path)
    options = opts(include_path=["inc"])
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, _ = compiled(cache, code, options=options)
    (tmp_path / "inc" / "sub" / "b.h").write_text("#define B 9\n")
    after, info = compiled(cache, code, options=options)
    assert not info.hit and after == truth(code, monkeypatch, options=options) != before


def test_absolute_include_is_checked_at_its_absolute_path(tmp_path, monkeypatch) -> None:
    # Compiled in proj/, then run from elsewhere/, which holds an old copy at the same
    # relative path: the compile reads the absolute path, so must the check.
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    for d in (proj, elsewhere):
        (d / "include").mkdir(parents=True)
    cfg = proj / "include" / "cfg.h"
    cfg.write_text("#define CFG 1\n")
    code = f'#include "{cfg}"\nextern "C" __global__ void k(int* x) {{ *x = CFG; }}\n'
    cache = FileStreamProgramCache(tmp_path / "cache")
    monkeypatch.chdir(proj)
    before, _ = compiled(cache, code)
    cfg.write_text("#define CFG 2\n")
    (elsewhere / "include" / "cfg.h").write_text("#define CFG 1\n")  # the old copy
    monkeypatch.chdir(elsewhere)
    after, info = compiled(cache, code)
    assert not info.hit and after == truth(code, monkeypatch) != before


def test_extra_digest_adds_to_the_key_and_keeps_header_tracking(tmp_path, monkeypatch) -> None:
    (tmp_path / "local.h").write_text("#define LOCAL 3\n")
    code = '#include "local.h"\nextern "C" __global__ void k(int* x) { *x = LOCAL; }\n'
    monkeypatch.chdir(tmp_path)
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, i1 = compiled(cache, code, extra_digest=b"build-7")
    assert compiled(cache, code, extra_digest=b"build-7")[1].hit
    assert not compiled(cache, code, extra_digest=b"build-8")[1].hit  # it is in the key
    (tmp_path / "local.h").write_text("#define LOCAL 30\n")
    after, info = compiled(cache, code, extra_digest=b"build-7")
    assert not info.hit and after == truth(code, monkeypatch) != before
    assert str(tmp_path / "local.h") in info.headers


# -- coarse timestamps: the digest memo and the race check on ext3 with 128-byte inodes --------


@contextlib.contextmanager
def mounted_ext3_128() -> Iterator[str]:
    """A real ext3 with 128-byte inodes: whole-second timestamps, as ext3 keeps them."""
    image = f"/tmp/kc-ext3-{uuid.uuid4().hex[:8]}.img"
    point = image[:-4]
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    try:
        made = subprocess.run(["mkfs.ext3", "-q", "-I", "128", image], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext3 image here: {made.stderr.decode().strip()}")
        os.makedirs(point)
        mounted = subprocess.run(["mount", "-o", "loop", image, point], capture_output=True)
        if mounted.returncode != 0:
            os.rmdir(point)
            pytest.skip(f"cannot loop-mount here (needs root): {mounted.stderr.decode().strip()}")
        try:
            yield point
        finally:
            subprocess.run(["umount", "-l", point], capture_output=True)
            with contextlib.suppress(OSError):
                os.rmdir(point)
    finally:
        os.unlink(image)


def _start_of_a_second() -> None:
    time.sleep(1.0 - time.time() % 1.0 + 0.01)


def test_digest_memo_sees_a_same_size_rewrite_within_one_second() -> None:
    with mounted_ext3_128() as point:
        path = os.path.join(point, "h.h")
        for _ in range(5):
            _start_of_a_second()
            with open(path, "w") as f:
                f.write("#define V 1\n")
            first = hdr.file_digest(path)
            st1 = os.stat(path)
            with open(path, "w") as f:
                f.write("#define V 2\n")  # same size, same second: same (ino, size, mtime, ctime)
            st2 = os.stat(path)
            if (st1.st_mtime_ns, st1.st_ctime_ns) == (st2.st_mtime_ns, st2.st_ctime_ns):
                break
        else:
            pytest.fail("could not rewrite within one second five times in a row")
        assert st1.st_mtime_ns % 1_000_000_000 == 0  # the filesystem really is coarse
        assert first == sha(b"#define V 1\n")
        assert hdr.file_digest(path) == sha(b"#define V 2\n")


def test_same_size_header_rewrite_within_one_second_is_a_miss(tmp_path, monkeypatch) -> None:
    code = '#include "h.h"\nextern "C" __global__ void k(int* x) { *x = V; }\n'
    with mounted_ext3_128() as point:
        monkeypatch.chdir(point)
        path = os.path.join(point, "h.h")
        for attempt in range(5):
            cache = FileStreamProgramCache(tmp_path / f"cache{attempt}")
            _start_of_a_second()
            with open(path, "w") as f:
                f.write("#define V 1\n")
            st1 = os.stat(path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the fresh header may make it unstorable
                compiled(cache, code)
                with open(path, "w") as f:
                    f.write("#define V 2\n")
                st2 = os.stat(path)
                after, _ = compiled(cache, code)
            if (st1.st_mtime_ns, st1.st_ctime_ns) == (st2.st_mtime_ns, st2.st_ctime_ns):
                break
        else:
            pytest.fail("could not compile and rewrite within one second five times in a row")
        assert after == truth(code, monkeypatch)


# -- a lost trace: one compile not stored, never a failed compile, tracking stays on ------------

# A real concurrent process in the trace's directory (the cache's tmp/, or the system temp
# dir): an over-eager tmp cleaner that deletes every trace file the moment it is opened (its
# creator's open included, so NVRTC writes into a file no name reaches any more), or anything
# clobbering tmp files, which overwrites a trace with an empty one whenever it is reopened after
# NVRTC wrote it. No race: fanotify holds each open in the kernel until the sweeper has acted.
_SWEEPER = r"""
import os, sys
sys.path.insert(0, sys.argv[1])
import _fswatch as fw
mode = sys.argv[2]
try:
    gate = fw.OpenGate()
except PermissionError as e:
    print("unprivileged", e, flush=True)  # fanotify permission events need CAP_SYS_ADMIN
    sys.exit()
for d in sys.argv[3:]:
    gate.add(d)
EMPTY = b'{"traceEvents":[]}'
def act(path, fd):
    if not (os.path.basename(path).startswith("kernelcache-trace") and path.endswith(".json")):
        return
    if mode == "delete":
        st = os.fstat(fd)
        try:
            if os.stat(path).st_ino == st.st_ino:
                os.unlink(path)
        except OSError:
            pass
    elif os.fstat(fd).st_size > 0 and os.pread(fd, len(EMPTY) + 1, 0) != EMPTY:
        os.ftruncate(fd, 0)
        os.pwrite(fd, EMPTY, 0)
print("watching", flush=True)
gate.serve(act)
"""

_UNDER_SWEEPER = r"""
import os, sys, warnings
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, KernelCacheWarning, compile_program
root, arch, proj = sys.argv[1], sys.argv[2], sys.argv[3]
os.chdir(proj)
cache = FileStreamProgramCache(root)
options = ProgramOptions(arch=arch, include_path=["inc"])
code = '#include "v.h"\nextern "C" __global__ void k(int* x) { *x = V + %d; }\n'
def run(n, target="cubin"):
    i = CompileInfo()
    compile_program(code % n, target_type=target, cache=cache, options=options, info=i)
    return i.hit
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = [run(1, "ptx"), run(2), run(3)]
    again = [run(1, "ptx"), run(2), run(3)]
lost = [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]
print("warnings", len(lost), all("trace" in m for m in lost))
print("stored", *again)
sys.stdout.flush()
input()  # the test stops the sweeper
print("later", run(4), run(4), run(5, "ptx"), run(5, "ptx"))
with open("inc/v.h", "w") as f:
    f.write("#define V 20\n")
print("edited", run(2), run(4), run(5, "ptx"))
"""


@pytest.mark.parametrize("mode", ["delete", "empty"])
def test_a_lost_trace_is_not_stored_and_tracking_stays_on(tmp_path, mode: str) -> None:
    # delete: ptxas reopens the trace NVVM wrote, finds it gone, and fails the compile, which
    # would succeed without the cache. empty: the trace names no header; storing that compile
    # would key it on no headers at all (stale on every edit).
    proj, systmp, root = tmp_path / "proj", tmp_path / "systmp", tmp_path / "cache"
    (proj / "inc").mkdir(parents=True)
    (proj / "inc" / "v.h").write_text("#define V 2\n")
    systmp.mkdir()
    with FileStreamProgramCache(root) as c:
        cache_tmp = c.tmp_dir
    sweeper = subprocess.Popen(
        [sys.executable, "-c", _SWEEPER, TESTS, mode, str(systmp), cache_tmp], stdout=subprocess.PIPE, text=True
    )
    try:
        assert sweeper.stdout is not None
        ready = sweeper.stdout.readline().strip()
        if ready.startswith("unprivileged"):
            pytest.skip(f"the sweeper needs fanotify permission events (root): {ready}")
        assert ready == "watching", ready
        child = subprocess.Popen(
            [sys.executable, "-c", _UNDER_SWEEPER, str(root), ARCH, str(proj)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(TMPDIR=str(systmp)),
        )
        assert child.stdout is not None and child.stdin is not None
        first = [child.stdout.readline().split(), child.stdout.readline().split()]
        if first != [["warnings", "1", "True"], ["stored", "False", "False", "False"]]:
            child.kill()
            pytest.fail(f"{first}: {child.communicate(timeout=60)[1]}")
    finally:
        sweeper.kill()
        sweeper.wait(10)
    out, err = child.communicate("\n", timeout=300)
    assert child.returncode == 0, err
    # One warning naming the trace, no compile failed, none of them stored (above). Tracking
    # was not turned off: later compiles with include_path work, hit, and see edits.
    assert out.split("\n")[:2] == ["later False True False True", "edited False False False"], out + err


# -- trace files live under the cache's own tmp/ ----------------------------------------------


def test_a_killed_compile_leaves_no_trace_in_the_system_temp_dir(tmp_path) -> None:
    proj, systmp = tmp_path / "proj", tmp_path / "systmp"
    proj.mkdir()
    systmp.mkdir()
    (proj / "val.h").write_text("#define VAL 1.0f\n")
    watch = _fswatch.Watch()
    watch.add(str(proj / "val.h"), _fswatch.IN_CLOSE_NOWRITE)
    script = (
        "import sys\nfrom cuda.core import ProgramOptions\n"
        "from kernelcache import FileStreamProgramCache, compile_program\n"
        f"compile_program(sys.argv[1], cache=FileStreamProgramCache({str(tmp_path / 'cache')!r}),"
        f" options=ProgramOptions(arch={ARCH!r}))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, SLOW], cwd=proj, env=child_env(TMPDIR=str(systmp)))
    try:
        assert watch.events(120), "the compile never read its header"
    finally:
        child.kill()  # mid-compile: NVRTC has read val.h and is optimizing
        child.wait(30)
        watch.close()
    assert [n for n in os.listdir(systmp) if n.startswith("kernelcache")] == []


def test_a_full_cache_disk_with_headers_still_compiles(tmp_path) -> None:
    # NVRTC aborts the whole process when it cannot write its trace (full disk): with traces
    # under the cache's tmp/, a full cache disk must mean "not tracked, not stored", never that.
    from helpers import mounted_tmpfs

    (tmp_path / "local.h").write_text("#define LOCAL 3\n")
    code = '#include "local.h"\nextern "C" __global__ void k(int* x) { *x = LOCAL; }\n'
    with mounted_tmpfs("256k") as point:
        FileStreamProgramCache(point).close()
        fd = os.open(os.path.join(point, "filler"), os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass  # the disk is now full
        finally:
            os.close(fd)
        script = (
            "import sys, os, warnings\nwarnings.simplefilter('ignore')\n"
            "from cuda.core import ProgramOptions\n"
            "from kernelcache import FileStreamProgramCache, compile_program\n"
            f"os.chdir({str(tmp_path)!r})\n"
            f"o = compile_program(sys.argv[1], cache=FileStreamProgramCache({point!r}),"
            f" options=ProgramOptions(arch={ARCH!r}))\n"
            "print(bytes(o.code)[:4] == b'\\x7fELF')\n"
        )
        assert run_python(script, code).strip() == "True"


# -- no trace where the source cannot name a file --------------------------------------------


def _traces_written(cache: FileStreamProgramCache, code: str, **kw) -> int:
    """How many trace files NVRTC created in the store's tmp/ during one compile_program."""
    watch = _fswatch.Watch()
    watch.add(cache.tmp_dir, _fswatch.IN_CREATE)
    try:
        compiled(cache, code, **kw)
        return sum(1 for _, _, name in watch.events(0.5) if name.startswith("kernelcache-trace"))
    finally:
        watch.close()


def test_no_trace_only_where_the_source_cannot_name_a_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local.h").write_text("#define LOCAL 3\n")
    cache = FileStreamProgramCache(tmp_path / "cache")
    body = 'extern "C" __global__ void k(int* x) { *x = %s; }\n'
    assert _traces_written(cache, body % "1") == 0
    # Angle-bracket names without include_path reach only NVRTC's own headers.
    assert _traces_written(cache, "#if __has_include(<nothing_here.h>)\n#endif\n" + body % "2") == 0
    assert _traces_written(cache, '#include "local.h"\n' + body % "LOCAL") == 1
    assert _traces_written(cache, "// no include here\n" + body % "4") == 1  # the word alone: traced
    options = opts(include_path=[str(tmp_path)])
    assert _traces_written(cache, "#if __has_include(<local.h>)\n#endif\n" + body % "5", options=options) == 1
    assert _traces_written(cache, body % "6", options=opts(pre_include=str(tmp_path / "local.h"))) == 1


def test_a_spliced_include_directive_is_still_tracked(tmp_path, monkeypatch) -> None:
    # "#inc\<newline>lude" is one directive after line splicing: the word "include" is not
    # in the text, yet the compile reads local.h.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local.h").write_text("#define LOCAL 3\n")
    code = '#inc\\\nlude "local.h"\nextern "C" __global__ void k(int* x) { *x = LOCAL; }\n'
    cache = FileStreamProgramCache(tmp_path / "cache")
    before, _ = compiled(cache, code)
    (tmp_path / "local.h").write_text("#define LOCAL 30\n")
    after, info = compiled(cache, code)
    assert not info.hit and after == truth(code, monkeypatch) != before


def test_a_fifo_at_a_recorded_header_path_is_unreadable_never_waited_on(tmp_path):
    # A manifest can record a header this compile never reads (another variant's path): a FIFO
    # planted there must read as "cannot be read" (a miss), not hang the look-up on open().
    fifo = tmp_path / "planted.h"
    os.mkfifo(fifo)
    real = tmp_path / "real.h"
    real.write_text("#define X 1\n")
    link = tmp_path / "link.h"
    link.symlink_to(real)
    code = (
        "import sys\n"
        "from kernelcache.headers.digests import file_digest\n"
        "print(file_digest(sys.argv[1]), file_digest(sys.argv[2]) == file_digest(sys.argv[3]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(fifo), str(link), str(real)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["None", "True"]
