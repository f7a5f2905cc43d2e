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

from helpers import ARCH

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

    info = CompileInfo()
    compile_program(src, options=opts, cache=cache, info=info)  # the miss that stores it
    path = os.path.join(root, "v2", "entries", info.entry_name[:2], info.entry_name)
    ten_ago = time.time_ns() - 10_000_000_000
    os.utime(path, ns=(ten_ago, ten_ago))  # as if written 10 s ago, never read since
    out = {"first": hit()}
    # An entry whose atime was set less than a second ago keeps it: no utime. (A guard, not
    # a timing check: a try stalled for half a second on a loaded machine is made again.)
    for _ in range(5):
        began = time.monotonic()
        os.utime(path, ns=(time.time_ns(), ten_ago))  # read just now
        out["recent"] = hit()
        if time.monotonic() - began < 0.5:
            break
    # An atime after the mtime (read since written) but older than the granularity is
    # moved again: the LRU clock keeps running. (The mtime stays: the file's identity.)
    os.utime(path, ns=(ten_ago + 5_000_000_000, ten_ago))
    out["stale"] = hit()
    out["atime_moved"] = os.stat(path).st_atime_ns > ten_ago + 5_000_000_000
    print(json.dumps(out))
    """
)


def _run_child(root: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, root, ARCH], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_hit_opens_one_file_and_moves_atime_at_most_once_a_second(tmp_path) -> None:
    out = _run_child(str(tmp_path))
    # First hit in this process: artifact and sidecar read and verified, and the atime set
    # (it was not after the mtime: never read since written).
    kinds, names = out["first"]
    assert kinds == ["open", "utime", "open"], out["first"]
    assert names[2] == names[0] + ".meta" and isinstance(names[1], int)  # utime on the open fd
    # A warm hit: the artifact alone is opened (its CRC checked; the sidecar stat'ed and
    # matched against the verified pair), and an atime set less than a second ago stays.
    assert out["recent"] == [["open"], [names[0]]], out["recent"]
    # An atime older than a second is moved again (the LRU clock keeps running).
    assert out["stale"][0] == ["open", "utime"], out["stale"]
    assert out["atime_moved"]
