"""The node's compile budget: processes started together never run more compiler processes than the
node has cores, and the misses they share are compiled once (real processes, real workers, /proc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings

from helpers import support_script

from kernelcache import FileStreamProgramCache

CHILD = support_script("_cold_children.py")
PROCS, KERNELS = 4, 16


def _workers_of(pids: list[int]) -> set[int]:
    """The compiler workers alive now among the children of ``pids`` (zombies are not running)."""
    found = set()
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            for kid in kids:
                try:
                    with open(f"/proc/{kid}/cmdline", "rb") as f:
                        cmdline = f.read()
                    with open(f"/proc/{kid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if b"kernelcache" in cmdline and state != "Z":
                    found.add(kid)
    return found


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def test_processes_started_together_run_at_most_one_compiler_per_core_and_compile_each_miss_once(tmp_path) -> None:
    root = str(tmp_path / "c")
    gate = str(tmp_path / "gate")  # they start together once every one imported cuda.core and kernelcache
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    args = [sys.executable, CHILD, "fleet", root, gate, str(PROCS), str(KERNELS)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, env=env) for _ in range(PROCS)]
    most = 0
    while any(p.poll() is None for p in procs):
        most = max(most, len(_workers_of([p.pid for p in procs])))
        time.sleep(0.001)
    outs = [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in procs]  # type: ignore[union-attr]
    assert all(p.returncode == 0 for p in procs)
    # Each process compiles in its own thread too (one compile at a time there): the workers of
    # all of them together hold no more than the node's cores.
    assert most <= _cores(), f"{most} compiler workers ran at once on {_cores()} cores"
    assert len({tuple(o["digests"]) for o in outs}) == 1
    assert FileStreamProgramCache(root).stats()["compiles"] == KERNELS


def test_idle_workers_of_one_process_give_their_slots_to_a_process_that_waits(tmp_path) -> None:
    """A process whose workers hold every slot, idle, does not keep another's compile waiting for
    WAIT_S (and compiling without a slot, with a warning): its idle workers end for it."""
    holder = subprocess.Popen(
        [sys.executable, CHILD, "hold_idle_workers", str(tmp_path / "a")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        held = json.loads(holder.stdout.readline())["pids"]  # type: ignore[union-attr]
        assert len(held) == _cores()  # every slot of the node is theirs
        from cuda.core import ProgramOptions
        from helpers import ARCH

        from kernelcache import KernelCacheWarning, compile_program

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compile_program(
                'extern "C" __global__ void w(float* a) { a[0] = 4.0f; }',
                options=ProgramOptions(arch=ARCH),
                cache=FileStreamProgramCache(tmp_path / "b"),
            )
        assert [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)] == []
        out, _ = holder.communicate("", timeout=120)
    finally:
        holder.kill()
    alive = json.loads(out.strip().splitlines()[-1])["alive"]
    assert len(alive) < len(held)  # at least one ended for us (idle for a minute otherwise)


def test_the_node_counts_its_batches_without_the_counters_counting_each_other(tmp_path, monkeypatch) -> None:
    # Counters in four processes count at once, as the helpers of batches do: a count that locked
    # each file for a moment saw the other counters' locks as batches (helpers of a lone batch on
    # the H200 host then waited: 2-3 workers of 8 started).
    from kernelcache.runners import slots

    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    ours = slots.join_batches()
    assert ours is not None
    counter = (
        "import json, time; from kernelcache.runners import slots; t = time.time() + 1.0\n"
        "while time.time() < t: pass\n"  # all four start counting together
        "print(json.dumps(sorted({slots.batches_now() for _ in range(3000)})))"
    )
    kids = [subprocess.Popen([sys.executable, "-c", counter], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    seen = set()
    for kid in kids:
        out, _ = kid.communicate(timeout=120)
        seen.update(json.loads(out))
    assert seen == {1}  # ours alone, never a counter
    ours.release()
    assert slots.batches_now() == 1 and slots.join_batches() is not None  # a released place is free again
