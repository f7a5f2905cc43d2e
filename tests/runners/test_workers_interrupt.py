"""compile_many's caller interrupted (Ctrl-C) or killed while its compiler workers start or
compile: real signals, real workers, the caller a child process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from helpers import SUPPORT, running, support_script
from sources import needs_bundled_headers

CHILD = support_script("_pool_faults.py")


def test_ctrl_c_while_workers_start_leaves_the_pool_whole_and_the_terminal_quiet(tmp_path) -> None:
    out = subprocess.run(
        [sys.executable, CHILD, "interrupt_starts", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    # A start cut short by Ctrl-C gives its place in the pool back: rounds beyond the pool's
    # size, and the batch after them, still get a worker (they waited for one forever).
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["interrupted"] >= 1 and got["compiled"] == 1 and got["workers"] == 1, got
    # A worker whose parent let go of it before it was ready ends without a word.
    assert "Traceback" not in out.stderr, out.stderr[-3000:]


def _busy_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@needs_bundled_headers
def test_a_worker_ends_with_its_caller_even_in_the_middle_of_a_compile(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SUPPORT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, CHILD, "compile_heavy", str(tmp_path)], stdout=subprocess.PIPE, env=env)
    try:
        worker = json.loads(proc.stdout.readline())["worker"]  # type: ignore[union-attr]
        start = _busy_ticks(worker)
        while _busy_ticks(worker) - start < 20:  # well into the CUB kernel's compile (seconds)
            time.sleep(0.01)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not running(worker)
    finally:
        proc.kill()
        proc.wait()
    # It stopped there: its compile never finished (NVRTC writes the header trace, in the
    # store's tmp/, when it does), and nothing of it is left to anyone.
    assert not [name for name in os.listdir(tmp_path / "c" / "v2" / "tmp") if name.startswith("kernelcache-trace-")]
