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
from kernelcache.runners.pool import pool

root, inc, arch, plan, action = sys.argv[1:6]
me = os.getpid()
with open(f"/proc/{me}/cmdline", "rb") as f:
    my_cmdline = f.read()

def forked_children():  # children with our command line: forks, or a worker not yet exec'd
    found = set()
    for tid in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{tid}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            continue  # a thread that ended
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read() == my_cmdline:
                        found.add(pid)
            except OSError:
                found.add(pid)  # a zombie has no command line left: one of ours, unreaped
    return found

def state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]

seen, alive, signal_now, edit_now, edited = [], [], threading.Event(), threading.Event(), []

def edit_once_traced():
    # The pass wrote its trace (its last act); the variant is built from it on the pass's thread
    # in about 10 ms, and the slow compile runs on for over a second: the edit lands in between.
    if any(n.endswith(".json") for n in os.listdir(cache.tmp_dir)):
        time.sleep(0.3)
        with open(os.path.join(inc, "nested.h"), "w") as f:
            f.write("#pragma once\n#define SCALE 4\n")
        edited.append(time.monotonic())

def watch():
    while True:
        if edit_now.is_set() and not edited:
            edit_once_traced()
        for pid in forked_children() - set(seen):
            seen.append(pid)
            if signal_now.is_set():  # the first seen: the pass's fork (a spare worker starts after it)
                signal_now.clear()
                alive.append(state(pid) in "RSD")  # signalled mid-pass, not once it had ended
                os.kill(pid, signal.SIGKILL if action == "kill" else signal.SIGSTOP)
        time.sleep(0.0002)

threading.Thread(target=watch, daemon=True).start()
cache = FileStreamProgramCache(root)
options = lambda: ProgramOptions(arch=arch, include_path=[inc])
body = open(os.path.join(inc, "kernel.cu")).read()
steps, workers_ever = [], set()
for n, what in enumerate(plan.split(",")):
    if n == 0 and action in ("kill", "stop"):
        signal_now.set()
    source = ('#include "broken.h"\n' if what == "bad" else '#include "deep.h"\n') + body + f"// {n}\n"
    if what == "slow":  # a quick front end, a slow codegen (1-2 s): the pass ends long before the compile
        source = '#include "deep.h"\nextern "C" __global__ void s(float* o) { float x = o[threadIdx.x];\n'
        source += "".join(f"x = sinf(x) * SCALE + cosf(x * {i}.0f); o[{i % 64}] += x;\n" for i in range(40)) + "}\n"
        edit_now.set()
    if action == "gpu":  # a live context and a launch before the fork: the child must not need the driver
        import gpu_kernels
        from cuda.core import Program
        plain = Program(gpu_kernels.SRC, "c++", options=ProgramOptions(arch=arch)).compile("cubin")
        before = gpu_kernels._scale_on(0, plain.get_kernel("scale"))[:4].tolist()
        source = '#include "deep.h"\n' + gpu_kernels.SRC.replace("*= a;", "*= a * SCALE;") + f"// {n}\n"
    forks, in_workers = len(seen), pool().compiles
    info, step = CompileInfo(), {}
    try:
        obj = compile_program(source, options=options(), cache=cache, info=info)
    except Exception as exc:
        step["error"] = type(exc).__name__
    signal_now.clear()
    edit_now.clear()
    time.sleep(0.01)  # the watcher's next look
    workers_ever.update(pool().pids())
    step.update(seen=seen[forks:], in_workers=pool().compiles - in_workers, left=sorted(forked_children()))
    if "error" not in step:
        again = CompileInfo()
        compile_program(source, options=options(), cache=cache, info=again)
        step.update(hit=info.hit, cached=info.cached, not_stored=info.not_stored, second_hit=again.hit,
                    headers=sorted(os.path.basename(h) for h in info.headers))
        if action == "gpu":
            step.update(before=before, after=gpu_kernels._scale_on(0, obj.get_kernel("scale"))[:4].tolist())
    steps.append(step)
for step in steps:  # a worker caught between its fork and its exec looked like a fork
    step["forks"] = len([pid for pid in step.pop("seen") if pid not in workers_ever])
print(json.dumps({"steps": steps, "signalled_alive": alive, "edited": len(edited)}))
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


def _run(tmp_path, plan: str, action: str = "watch", arch: str = ARCH) -> dict:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}  # compile slots of this test's own
    env["PYTHONPATH"] = os.pathsep.join([SUPPORT, *(os.path.abspath(p) for p in sys.path if p)])
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "cache"), _project(tmp_path), arch, plan, action],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def _stored_with_every_header(step: dict) -> None:
    assert step["left"] == [], step  # every forked child reaped: none left, no zombie
    assert step["hit"] is False and step["cached"] is True, step
    assert step["headers"] == ["deep.h", "nested.h"], step
    assert step["second_hit"] is True, step


def test_the_first_pass_runs_in_a_fork_the_next_in_a_spare_worker(tmp_path) -> None:
    first, second = _run(tmp_path, "good,good")["steps"]
    assert (first["forks"], first["in_workers"]) == (1, 0), first
    assert (second["forks"], second["in_workers"]) == (0, 1), second  # the worker the first miss started
    _stored_with_every_header(first)
    _stored_with_every_header(second)


def test_a_killed_pass_child_is_replaced_by_the_pass_here(tmp_path) -> None:
    # The child dies mid-pass (a SIGKILL: the OOM killer's way): its half-written trace is removed
    # and the pass runs in this process after the compile, as it would without a child.
    out = _run(tmp_path, "good", "kill")
    assert out["signalled_alive"] == [True], out
    _stored_with_every_header(out["steps"][0])


def test_a_stopped_pass_child_is_killed_at_its_bound_and_replaced(tmp_path) -> None:
    # A child that never ends (stopped here; stuck, in life, on a lock a fork caught held) is
    # killed past its bound, and the pass runs here: the compile returns, stored.
    out = _run(tmp_path, "good", "stop")
    assert out["signalled_alive"] == [True], out
    _stored_with_every_header(out["steps"][0])


def test_failed_compiles_leave_no_child_and_later_misses_are_stored_whole(tmp_path) -> None:
    # A failed compile's pass fails too, in a fork (first) or in the worker (third): NVRTC's state
    # after a failed traced compile (header events dropped from every later trace) ends with that
    # process (the worker is dropped), so every later miss here still lists every header.
    bad, good, bad_in_worker, good_after = _run(tmp_path, "bad,good,bad,good")["steps"]
    assert bad["error"] == "NVRTCError" and bad["forks"] == 1 and bad["left"] == []
    _stored_with_every_header(good)
    assert bad_in_worker["error"] == "NVRTCError" and bad_in_worker["in_workers"] == 1
    _stored_with_every_header(good_after)


def test_a_header_edited_after_the_variant_was_built_beside_the_compile_is_not_stored(tmp_path) -> None:
    # Race: the second miss's pass runs in the worker the first left, and its variant is built
    # from the trace while the compile still runs; a header edited after that (here 0.3 s after
    # the trace appeared, the compile more than a second from its end) may be what NVRTC read.
    # The check after the compile sees it stamped after the start: nothing is stored.
    out = _run(tmp_path, "good,slow", "edit")
    first, slow = out["steps"]
    _stored_with_every_header(first)
    assert out["edited"] == 1 and slow["in_workers"] == 1, out
    assert slow["cached"] is False and "nested.h" in slow["not_stored"], slow
    assert slow["second_hit"] is False  # nothing was stored under the old digest


@pytest.mark.gpu
def test_the_pass_forks_from_a_process_with_a_live_context_and_the_kernel_runs(tmp_path) -> None:
    # A GPU process: a context made and a kernel launched before the fork. The child runs NVRTC
    # alone (it never touches the parent's context); the stored kernel launches and is right.
    from cuda.core import Device

    major, minor = Device(0).compute_capability
    for step in _run(tmp_path, "good,good", "gpu", arch=f"sm_{major}{minor}")["steps"]:
        assert step["before"] == [0.0, 3.0, 6.0, 9.0]
        assert step["after"] == [0.0, 9.0, 18.0, 27.0]
        _stored_with_every_header(step)


_LONG_FRONT_END = r"""
import sys
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_program
n = 1500  # templates instantiated 150 deep: a front end of seconds (7 s here), a pass as long
src = '#include "nested.h"\n' + "".join(
    f"template <int N> struct C{i} {{ static constexpr long v = C{i}<N - 1>::v + N % {i + 2}; }};\n"
    f"template <> struct C{i}<0> {{ static constexpr long v = 0; }};\n" for i in range(n))
src += 'extern "C" __global__ void k(long* o) { o[0] = ' + " + ".join(f"C{i}<150>::v" for i in range(n)) + "; }\n"
compile_program(src, options=ProgramOptions(arch=sys.argv[3], include_path=[sys.argv[2]]), cache=FileStreamProgramCache(sys.argv[1]))
"""


def _forks(pid: int) -> list[int]:
    """The children of ``pid`` running its own command line (its forks; not a helper it spawned)."""
    found = []
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            own = f.read()
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                for child in f.read().split():
                    with open(f"/proc/{child}/cmdline", "rb") as g:
                        if g.read() == own:
                            found.append(int(child))
    except OSError:
        pass  # a thread or child that ended meanwhile: looked at again next time
    return found


def test_the_pass_child_ends_with_its_parent(tmp_path) -> None:
    # Nothing kernelcache starts outlives the caller: the caller is SIGKILLed while its fork runs
    # a pass of seconds; the child must end then (it is told by the kernel: PR_SET_PDEATHSIG),
    # not when its pass would have.
    import time

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", _LONG_FRONT_END, str(tmp_path / "cache"), _project(tmp_path), ARCH], env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not (children := _forks(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, "no pass was forked"
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait()
    (child,) = children
    end = time.monotonic() + 3  # the pass alone runs for seconds longer than this
    while os.path.exists(f"/proc/{child}") and time.monotonic() < end:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{child}"), "the pass's child outlived its parent"
