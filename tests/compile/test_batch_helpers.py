"""compile_many's default choice: a helper thread takes requests only once its worker is ready, and
with another batch on the node it starts no worker in the batch's first FLEET_WAIT_S.

Real workers, a real SIGSTOP, a real second process holding its place among the node's batches.
Each case runs in a fresh interpreter with its own compile slots (XDG_RUNTIME_DIR), so that another
test run's compiles or batches on this machine are not seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ARCH

from kernelcache.runners import slots

pytestmark = pytest.mark.skipif(slots.usable_cores() < 2, reason="helpers start workers only with 2 cores or more")

_COMMON = r"""
import json, os, signal, subprocess, sys, threading, time
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile import batch as batch_mod
from kernelcache.runners.choice import MIN_MISSES
from kernelcache.runners.pool import pool

root, arch, tag = sys.argv[1:4]
cache = FileStreamProgramCache(root)

def requests(salt):
    code = 'extern "C" __global__ void k(float* x) {{ x[threadIdx.x] *= {n}.0f + {salt}.0f; }}'
    return [{"code": code.format(n=n, salt=salt), "options": ProgramOptions(arch=arch)} for n in range(MIN_MISSES)]
"""

_STOPPED_WORKER = r"""
stopped = []

def watch():  # every worker this process starts is stopped the moment it exists, long before it is ready
    while True:
        for pid in pool().pids():
            if pid not in stopped:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
        time.sleep(0.0005)

threading.Thread(target=watch, daemon=True).start()
done = threading.Event()
threading.Thread(target=lambda: (compile_many(requests(1), cache=cache), done.set()), daemon=True).start()
finished = done.wait(30)
for pid in stopped:
    os.kill(pid, signal.SIGCONT)
print(json.dumps({"finished": finished, "stopped": len(stopped), "worker_compiles": pool().compiles,
                  "compiles": cache.stats()["compiles"]}))
"""

_OTHER_BATCH = r"""
holder = subprocess.Popen(
    [sys.executable, "-c", "from kernelcache.runners import slots; s = slots.join_batches(); "
     "print('in' if s else 'none', flush=True); import sys; sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
)
said = holder.stdout.readline().strip()
began = time.monotonic()
compile_many(requests(2), cache=cache)
alongside = {"seconds": time.monotonic() - began, "started": pool().started}
holder.stdin.close()
holder.wait()
compile_many(requests(3), cache=cache)  # alone on the node again
print(json.dumps({"holder": said, "alongside": alongside, "alone_started": pool().started - alongside["started"],
                  "fleet_wait_s": batch_mod.FLEET_WAIT_S, "compiles": cache.stats()["compiles"]}))
"""


def _run(tmp_path, script: str) -> dict:
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime))
    done = subprocess.run(
        [sys.executable, "-c", _COMMON + script, str(tmp_path / "c"), ARCH, "t"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_worker_stopped_while_it_starts_holds_up_no_request(tmp_path) -> None:
    # The helper's worker is stopped (SIGSTOP) before it could say it is ready. Before, the helper
    # had already handed it a request, which then waited for the worker (a stopped compiler is
    # waited for), and the batch with it: it never finished until SIGCONT.
    got = _run(tmp_path, _STOPPED_WORKER)
    assert got["stopped"] >= 1  # a helper did start a worker
    assert got["finished"], "the batch waited for a worker that never became ready"
    assert got["worker_compiles"] == 0  # every request compiled in the caller's thread
    assert got["compiles"] == 16


def test_with_another_batch_on_the_node_no_worker_starts_in_the_first_second(tmp_path) -> None:
    got = _run(tmp_path, _OTHER_BATCH)
    assert got["holder"] == "in"
    alongside = got["alongside"]
    if alongside["seconds"] < got["fleet_wait_s"]:  # a batch that ran past it may start some: no claim then
        assert alongside["started"] == 0, "a worker was started although another batch runs on the node"
    assert got["alone_started"] >= 1  # alone on the node, its helper starts one at once
    assert got["compiles"] == 32
