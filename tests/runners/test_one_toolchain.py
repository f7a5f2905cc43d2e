"""Compiler workers run the caller's own NVRTC, say why when they cannot start, and end with their
caller: real workers, real /proc, a venv made by an interpreter that has no CUDA wheels of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

from cuda.core import ProgramOptions
from helpers import ARCH, support_script

from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.runners.pool import pool

CHILD = support_script("_cold_children.py")


def child(*args: str, env: dict[str, str] | None = None) -> tuple[dict[str, object], str]:
    """(the JSON line a _cold_children.py role printed, its whole stderr)."""
    out = subprocess.run(
        [sys.executable, CHILD, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def mapped_nvrtc(pid: int) -> set[tuple[str, str]]:
    """The libnvrtc files process ``pid`` maps: (path, device:inode) as /proc/PID/maps shows them."""
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libnvrtc.so"):
                found.add((fields[5].strip(), f"{fields[3]}:{fields[4]}"))
    return found


def test_a_worker_maps_the_very_libnvrtc_file_its_caller_maps(tmp_path) -> None:
    reqs = [{"code": 'extern "C" __global__ void m(float* a) { a[0] = 2.0f; }', "options": ProgramOptions(arch=ARCH)}]
    # Fresh workers only: a spare an earlier test's header pass started (runners.beside) may still
    # be starting, before its NVRTC is loaded.
    pool().close()
    compiled = pool().compiles
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path), processes=True)
    assert pool().compiles == compiled + 1  # in a worker, not in this process
    mine = mapped_nvrtc(os.getpid())
    assert len(mine) == 1, mine
    for pid in pool().pids():
        assert mapped_nvrtc(pid) == mine


def test_a_worker_that_cannot_start_is_reported_once_with_its_stderr_and_nothing_else(tmp_path) -> None:
    got, stderr = child("broken_start", str(tmp_path))
    # The compiles ran in the caller and were stored; one warning says so, and why.
    assert got["compiled"] == 3 and got["compiles"] == 3
    shown = [w for w in got["warnings"] if "worker" in w]
    assert len(shown) == 1, got["warnings"]
    assert "compiling in this process" in shown[0] and "No module named 'encodings'" in shown[0], shown[0]
    # Nothing of the dead workers reached the terminal (the child recorded its warnings).
    assert stderr.strip() == "", stderr[-3000:]


def _alive_with(mark: str) -> list[int]:
    """Processes (not zombies) whose environment holds ``mark``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if mark.encode() not in f.read():
                    continue
            with open(f"/proc/{name}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            continue
        found.append(int(name))
    return found


def test_nothing_of_kernelcache_outlives_its_processes_whatever_is_set(tmp_path) -> None:
    mark = f"KERNELCACHE_TEST_MARK={uuid.uuid4().hex}"
    runtime = tmp_path / "rt"
    runtime.mkdir(mode=0o700)
    # KERNELCACHE_COMPILE_SERVER=1: what a user of the last release may still have set.
    env = {mark.split("=")[0]: mark.split("=")[1], "XDG_RUNTIME_DIR": str(runtime), "KERNELCACHE_COMPILE_SERVER": "1"}
    for n in range(2):
        got, _ = child("in_workers", str(tmp_path / f"c{n}"), env=env)
        assert got["compiled"] == 2
    deadline = time.monotonic() + 15
    while _alive_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_with(mark) == []


def test_a_compile_server_setting_is_one_warning_that_it_is_gone_and_0_is_none(tmp_path) -> None:
    got, _ = child("in_workers", str(tmp_path / "a"), env={"KERNELCACHE_COMPILE_SERVER": "1"})
    assert len([w for w in got["warnings"] if "KERNELCACHE_COMPILE_SERVER" in w and "no longer" in w]) == 1
    got, _ = child("in_workers", str(tmp_path / "b"), env={"KERNELCACHE_COMPILE_SERVER": "0"})
    assert not [w for w in got["warnings"] if "KERNELCACHE_COMPILE_SERVER" in w]
