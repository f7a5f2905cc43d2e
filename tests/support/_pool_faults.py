"""compile_many in a child process of its own, for what a test does to it from outside:
``python _pool_faults.py ROLE ROOT``; prints JSON lines.

interrupt_starts: rounds of a batch on a fresh pool, each raising SIGINT in this process the
moment its compiling thread has forked a worker (seen in /proc), so the KeyboardInterrupt
lands while that worker starts; then one batch more must compile.
compile_heavy: a batch of one slow compile in a worker, into the store at ROOT/c; says the
worker's pid once it is compiling (for the test to kill this process then).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time

ARCH = "sm_90"
KERNEL = 'extern "C" __global__ void i{n}(float* a) {{ a[threadIdx.x] *= {n}.25f; }}\n'


def _children(tid: int) -> set[str]:
    with open(f"/proc/self/task/{tid}/children") as f:
        return set(f.read().split())


def _running_children() -> list[str]:
    """This process's children that still run (a zombie has ended: its slot is free)."""
    from helpers import running

    return [pid for tid in os.listdir("/proc/self/task") for pid in _children(int(tid)) if running(int(pid))]


def _interrupt_at_its_next_child(tid: int, known: set[str], done: threading.Event) -> None:
    """SIGINT the moment the compiling thread has forked a worker: seen in /proc, or in the
    workers this process holds pipes to (worker._LIVE: right after the fork, while the worker
    imports; /proc/PID/task/TID/children alone missed whole starts under load)."""
    from kernelcache.runners import worker

    live = len(worker._LIVE)  # a start cut short may leave one there: only a new one counts
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        if len(worker._LIVE) > live or _children(tid) - known:
            os.kill(os.getpid(), signal.SIGINT)
            return
        time.sleep(0.0005)


def interrupt_starts(root: str) -> dict[str, object]:
    # Python's own Ctrl-C handler, also where this process was started with SIGINT ignored (a
    # background job of a non-interactive shell, `./scripts/test &`: every round went by).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_many
    from kernelcache.runners.pool import pool

    def batch(n: int) -> list[object]:
        reqs = [{"code": KERNEL.format(n=n), "options": ProgramOptions(arch=ARCH)}]
        return compile_many(
            reqs, cache=FileStreamProgramCache(os.path.join(root, str(n))), processes=True, max_workers=1
        )

    interrupted, rounds = 0, []
    tid = threading.get_native_id()
    for n in range(pool().limit + 1):  # more rounds than the pool has workers
        pool().close()
        done = threading.Event()
        watcher = threading.Thread(target=_interrupt_at_its_next_child, args=(tid, _children(tid), done))
        watcher.start()
        try:
            try:
                batch(n)
            finally:
                done.set()
                watcher.join()
        except KeyboardInterrupt:
            interrupted += 1
        rounds.append({"started": pool().started, "compiles": pool().compiles, "unavailable": pool().unavailable})
    # A worker whose start was cut short ends once it sees its pipes closed, and frees its slot of
    # the node's then; the batch after that gets a worker again.
    pool().close()
    deadline = time.monotonic() + 30
    while _running_children() and time.monotonic() < deadline:
        time.sleep(0.01)
    objs = batch(1000)
    return {"interrupted": interrupted, "compiled": len(objs), "workers": len(pool().pids()), "rounds": rounds}


def compile_heavy(root: str) -> dict[str, object]:
    from cuda.core import ProgramOptions
    from sources import HEAVY

    from kernelcache import FileStreamProgramCache, compile_many
    from kernelcache.runners.pool import pool

    def say_when_compiling() -> None:
        while not pool().pids(compiling=True):
            time.sleep(0.001)
        print(json.dumps({"worker": pool().pids(compiling=True)[0]}), flush=True)

    threading.Thread(target=say_when_compiling, daemon=True).start()
    # The CUB kernel behind a header of ours: tracked, so NVRTC writes its header trace into
    # the store's tmp/ when the compile ends.
    inc = os.path.join(root, "inc")
    os.makedirs(inc)
    with open(os.path.join(inc, "heavy.h"), "w") as f:
        f.write(HEAVY)
    options = ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17", include_path=inc)
    cache = FileStreamProgramCache(os.path.join(root, "c"))
    compile_many([{"code": '#include "heavy.h"\n', "options": options}], cache=cache, processes=True)
    return {"done": True}


if __name__ == "__main__":
    faulthandler.dump_traceback_later(90, exit=True)  # a hang ends the child (the test sees it)
    print(json.dumps(globals()[sys.argv[1]](sys.argv[2])), flush=True)
