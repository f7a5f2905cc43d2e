"""The file store's hit path in exact counts: files opened and atimes set per compile_program hit.

The counts come from Python's audit events (``open`` for os.open, ``os.utime``), observed in
a fresh interpreter (an audit hook cannot be removed), with a real NVRTC compile and a real
cache directory. Timing stays out: only what a hit does, never how long it takes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import ARCH

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

    root = os.path.realpath(sys.argv[1])
    src = 'extern "C" __global__ void fill(float* a, float v) { a[threadIdx.x] = v; }\\n'
    opts = ProgramOptions(arch=sys.argv[2])
    cache = FileStreamProgramCache(root)
    events = []
    recording = False

    def hook(event, args):
        if not recording:
            return
        if event == "open" and str(args[0]).startswith(root):
            events.append(("open", os.path.relpath(str(args[0]), root)))
        elif event == "os.utime":
            events.append(("utime", args[0] if isinstance(args[0], int) else os.path.relpath(args[0], root)))

    sys.addaudithook(hook)

    def hit():
        global recording
        del events[:]
        info = CompileInfo()
        recording = True
        compile_program(src, options=opts, cache=cache, info=info)
        recording = False
        assert info.hit
        return [kind for kind, _ in events], [name for _, name in events]

    compile_program(src, options=opts, cache=cache)  # the miss that stores it
    out = {"first": hit()}
    # An entry read less than a second ago keeps its atime: no utime. (A guard, not a
    # timing check: a pair of calls split by a stall on a loaded machine is tried again.)
    for _ in range(5):
        began = time.monotonic()
        out["recent"] = hit()
        if time.monotonic() - began < 0.5:
            break
    # An atime older than the granularity is moved again.
    info = CompileInfo()
    compile_program(src, options=opts, cache=cache, info=info)
    path = os.path.join(root, "v2", "entries", info.entry_name[:2], info.entry_name)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns - 2_000_000_000, st.st_mtime_ns))
    out["stale"] = hit()
    out["atime_moved"] = os.stat(path).st_atime_ns > st.st_atime_ns
    print(json.dumps(out))
    """
)


def _run_child(root: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, root, ARCH], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_hit_opens_one_file_and_moves_atime_at_most_once_a_second(tmp_path) -> None:
    out = _run_child(str(tmp_path))
    # First hit in this process: artifact and sidecar read and verified, atime set.
    kinds, names = out["first"]
    assert kinds == ["open", "utime", "open"], out["first"]
    assert names[2] == names[0] + ".meta" and isinstance(names[1], int)  # utime on the open fd
    # A warm hit: the artifact alone is opened (its CRC checked; the sidecar stat'ed and
    # matched against the verified pair), and an atime set less than a second ago stays.
    assert out["recent"] == [["open"], [names[0]]], out["recent"]
    # An atime older than a second is moved again (the LRU clock keeps running).
    assert out["stale"][0] == ["open", "utime"], out["stale"]
    assert out["atime_moved"]
