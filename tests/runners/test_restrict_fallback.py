"""NVRTC's --restrict leak where no compiler worker can start: nothing leaked is stored.

NVRTC keeps --restrict on for the rest of a process once one compile used it. kernelcache
compiles restrict=True in a worker process; where workers cannot start, the compile runs in
the caller's process, and from then on that process's compiles are returned but not stored
(one warning), except those that ran in a worker (a forked child's). Real processes: a
writer, a reader, and a fresh process that compiled nothing else; the PTX shows the leak
(ld.global.nc: the loads of a pointer that may alias go through the read-only cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import SUPPORT

HERE = SUPPORT


def child(role: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "_restrict_children.py"), role, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_process_that_compiled_restrict_here_stores_nothing_it_compiles_here_afterwards(tmp_path) -> None:
    root = str(tmp_path / "cache")
    fresh = {n: child("fresh", str(n))["ptx"] for n in (2, 4, 6, 8)}
    assert not any("ld.global.nc" in ptx for ptx in fresh.values())

    written = child("writer", root)
    assert "ld.global.nc" in written["restricted"]
    # The leak is real in the writer: what it returns is what this process compiles.
    assert all("ld.global.nc" in ptx for ptx in written["clean"])
    assert "ld.global.nc" in written["child"]["here"]  # a forked child keeps it for its own compiles

    read = child("reader", root)
    for n in ("2", "4", "8"):
        assert not read[n]["hit"], f"kernel {n}: the writer stored a compile that --restrict leaked into"
        assert read[n]["ptx"] == fresh[int(n)]
    # A compile in a worker is a fresh process's: stored, and the reader's hit.
    assert written["child"]["worker"] == fresh[6]
    assert read["6"]["hit"] and read["6"]["ptx"] == fresh[6]
    # One warning says why the writer's own compiles are not stored.
    assert len([w for w in written["warnings"] if "restrict" in w and "not stored" in w]) == 1, written["warnings"]
