"""NVRTC's --restrict leak stays out of the caller also where no compiler worker can start.

NVRTC keeps --restrict on for the rest of a process once one compile used it. A restrict=True
compile therefore never runs in the caller's process: in a worker, or where no worker can start
(no interpreter), in a process forked for it alone. The caller's later compiles are a fresh
process's, and stored. Real processes: a writer, a reader, and a fresh process that compiled
nothing else; the PTX shows the leak (ld.global.nc: the loads of a pointer that may alias go
through the read-only cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import SUPPORT


def child(role: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "_restrict_children.py"), role, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=SUPPORT,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("context", ["", pytest.param("gpu", marks=pytest.mark.gpu)], ids=["no-context", "context"])
def test_without_workers_restrict_compiles_elsewhere_and_the_caller_keeps_storing(tmp_path, context) -> None:
    root = str(tmp_path / "cache")
    fresh = {n: child("fresh", str(n))["ptx"] for n in (2, 4)}
    assert not any("ld.global.nc" in ptx for ptx in fresh.values())

    written = child("writer", root, context)
    assert "ld.global.nc" in written["restricted"]  # restrict=True did apply, out of this process
    # The writer's own compiles afterwards are a fresh process's, and they are stored.
    assert written["clean"] == [fresh[2], fresh[4]]
    read = child("reader", root)
    for n in ("2", "4"):
        assert read[n] == {"hit": True, "ptx": fresh[int(n)]}
    # One warning says that workers cannot start here; none says that anything was not stored.
    assert len([w for w in written["warnings"] if "worker" in w]) == 1, written["warnings"]
    assert not [w for w in written["warnings"] if "not stored" in w], written["warnings"]
