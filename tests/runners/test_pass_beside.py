"""A miss's header pass runs in a child forked for it while this process compiles, and whatever
happens to that child (it ends, it is killed, it is stopped, the compile fails) the result is
what the pass after the compile would give: stored with every header it read, never a child left.

Real NVRTC, real forks and real signals: a watcher thread finds the child in /proc and sends it
SIGKILL or SIGSTOP. Each case runs in a fresh interpreter with its own compile slots, so that
another test run's compiles on this machine cannot take the second slot the pass needs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ARCH, SUPPORT

from kernelcache.runners import slots

pytestmark = pytest.mark.skipif(slots.usable_cores() < 2, reason="the pass runs beside the compile only with 2 cores")

_CHILD = r"""
import json, os, signal, sys, threading, time
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

root, inc, arch, action = sys.argv[1:5]
me = os.getpid()

def children():
    found = set()
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                found.update(int(p) for p in f.read().split())
        except OSError:
            pass  # a thread that ended
    return found

seen, alive, done = [], [], threading.Event()

def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]

def watch():
    while not done.is_set():
        for pid in children() - set(seen):
            seen.append(pid)
            if action in ("kill", "stop"):
                alive.append(state(pid) in "RSD")  # signalled mid-pass, not once it had ended
                os.kill(pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        time.sleep(0.0002)

cache = FileStreamProgramCache(root)
options = lambda: ProgramOptions(arch=arch, include_path=[inc])
watcher = threading.Thread(target=watch, daemon=True)
watcher.start()
out = {}
if action == "fail":
    try:
        compile_program('#include "broken.h"\n' + open(os.path.join(inc, "kernel.cu")).read(), options=options(), cache=cache)
        out["failed"] = False
    except Exception as exc:
        out["failed"] = type(exc).__name__
    out["children_after_failure"] = sorted(children())
source = '#include "deep.h"\n' + open(os.path.join(inc, "kernel.cu")).read()
if action == "gpu":  # a live context and a launch before the fork: the child must not need the driver
    import gpu_kernels
    from cuda.core import Program
    plain = Program(gpu_kernels.SRC, "c++", options=ProgramOptions(arch=arch)).compile("cubin")
    out["before"] = gpu_kernels._scale_on(0, plain.get_kernel("scale"))[:4].tolist()
    source = '#include "deep.h"\n' + gpu_kernels.SRC.replace("*= a;", "*= a * SCALE;")
first = CompileInfo()
obj = compile_program(source, options=options(), cache=cache, info=first)
if action == "gpu":
    out["after"] = gpu_kernels._scale_on(0, obj.get_kernel("scale"))[:4].tolist()
done.set()
watcher.join()
out["children_after"] = sorted(children())
second = CompileInfo()
compile_program(source, options=options(), cache=cache, info=second)
out.update(seen=len(seen), signalled_alive=alive, first_hit=first.hit, cached=first.cached, not_stored=first.not_stored,
           headers=sorted(os.path.basename(h) for h in first.headers), second_hit=second.hit)
print(json.dumps(out))
"""


def _project(tmp_path) -> str:
    """A header whose front-end pass takes long enough to be caught (hundreds of templates)."""
    inc = tmp_path / "inc"
    inc.mkdir()
    body = "".join(
        f"template <typename T> __device__ T f{i}(T x) {{ return x * T({i}) + T({i % 7}); }}\n" for i in range(800)
    )
    (inc / "deep.h").write_text('#pragma once\n#include "nested.h"\n' + body)
    (inc / "nested.h").write_text("#pragma once\n#define SCALE 3\n")
    (inc / "broken.h").write_text("#pragma once\nthis is not C++;\n")
    calls = "".join(f"o[{i}] = f{i}(o[{i}]) * SCALE;" for i in range(0, 800, 3))
    (inc / "kernel.cu").write_text(f'extern "C" __global__ void k(float* o) {{ {calls} }}\n')
    return str(inc)


def _run(tmp_path, action: str, arch: str = ARCH) -> dict:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}  # compile slots of this test's own
    env["PYTHONPATH"] = os.pathsep.join([SUPPORT, *(os.path.abspath(p) for p in sys.path if p)])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "cache"), _project(tmp_path), arch, action],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _stored_with_every_header(out: dict) -> None:
    assert out["seen"] >= 1  # the pass ran in a child of its own
    assert out["children_after"] == []  # reaped: no child, no zombie
    assert out["first_hit"] is False and out["cached"] is True, out["not_stored"]
    assert out["headers"] == ["deep.h", "nested.h"]
    assert out["second_hit"] is True


def test_the_pass_runs_in_a_child_and_the_miss_is_stored_with_its_headers(tmp_path) -> None:
    _stored_with_every_header(_run(tmp_path, "watch"))


def test_a_killed_pass_child_is_replaced_by_the_pass_here(tmp_path) -> None:
    # The child dies mid-pass (a SIGKILL: the OOM killer's way): its half-written trace is removed
    # and the pass runs in this process after the compile, as it would without a child.
    out = _run(tmp_path, "kill")
    assert out["signalled_alive"] == [True]
    _stored_with_every_header(out)


def test_a_stopped_pass_child_is_killed_at_its_bound_and_replaced(tmp_path) -> None:
    # A child that never ends (stopped here; stuck, in life, on a lock a fork caught held) is
    # killed past its bound, and the pass runs here: the compile returns, stored.
    out = _run(tmp_path, "stop")
    assert out["signalled_alive"] == [True]
    _stored_with_every_header(out)


def test_a_failed_compile_leaves_no_child_and_the_next_miss_is_stored_whole(tmp_path) -> None:
    # The failed compile's pass failed too, in the child: NVRTC's state after a failed traced
    # compile (header events dropped from every later trace) ended with that child, so the next
    # miss in this process still lists every header and is stored.
    out = _run(tmp_path, "fail")
    assert out["failed"] == "NVRTCError"
    assert out["children_after_failure"] == []
    _stored_with_every_header(out)


@pytest.mark.gpu
def test_the_pass_forks_from_a_process_with_a_live_context_and_the_kernel_runs(tmp_path) -> None:
    # A GPU process: a context made and a kernel launched before the fork. The child runs NVRTC
    # alone (it never touches the parent's context); the stored kernel launches and is right.
    from cuda.core import Device

    major, minor = Device(0).compute_capability
    out = _run(tmp_path, "gpu", arch=f"sm_{major}{minor}")
    assert out["before"] == [0.0, 3.0, 6.0, 9.0]
    assert out["after"] == [0.0, 9.0, 18.0, 27.0]
    _stored_with_every_header(out)
