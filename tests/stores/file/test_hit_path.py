"""The file store's hit path in exact counts: files opened and last uses stamped per compile_program hit.

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
    side = path + ".meta"
    ten_ago = time.time_ns() - 10_000_000_000
    for p in (path, side):
        os.utime(p, ns=(ten_ago, ten_ago))  # as if written 10 s ago, never read since
    time.sleep(0.1)  # its ctime (now: utime sets it) past the racy window (stores/file/payloads.py)
    out = {"first": hit()}
    # A hit right after one that stamped: no utime, no sidecar read. (A guard, not a timing
    # check: a try stalled for half a second on a loaded machine is made again.)
    for _ in range(5):
        began = time.monotonic()
        out["recent"] = hit()
        if time.monotonic() - began < 0.5:
            break
    # A stamp older than the granularity is made again: the LRU clock keeps running. (The
    # entry file's times stay: its mtime is part of its identity.)
    before = os.stat(side).st_mtime_ns
    time.sleep(1.05)
    out["stale"] = hit()
    out["stamp_moved"] = os.stat(side).st_mtime_ns > before
    out["entry_kept"] = os.stat(path).st_mtime_ns == ten_ago
    print(json.dumps(out))
    """
)


def _run_child(root: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, root, ARCH], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_hit_opens_one_file_and_stamps_its_use_at_most_once_a_second(tmp_path) -> None:
    out = _run_child(str(tmp_path))
    # First hit in this process: artifact and sidecar read and verified, then the use stamped
    # on the sidecar (utime to now: any member of a team cache may do that; stores/file/lru.py).
    kinds, names = out["first"]
    assert kinds == ["open", "open", "utime"], out["first"]
    assert names[1] == names[0] + ".meta" and names[2] == names[1]
    # A warm hit opens no file at all: the pair this process verified is served from memory
    # while the entry file is still that very file (one lstat: stores/file/payloads.py), and a
    # stamp less than a second old stays.
    assert out["recent"] == [[], []], out["recent"]
    # A stamp older than a second is made again, the sidecar not read again for it.
    assert out["stale"] == [["open", "utime"], [names[0], names[1]]], out["stale"]
    assert out["stamp_moved"] and out["entry_kept"]
