"""What a miss makes durable: the artifact it stores is fsync'ed before it is published; the source
index beside it (read only to explain a later miss, never by a hit) is not. Counted with strace
on a real compile: one fsync per miss, as cuda.core's own cache makes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from helpers import ARCH

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (apt-get install strace)")

_SCRIPT = r"""
import sys
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_program

root, arch, misses = sys.argv[1], sys.argv[2], int(sys.argv[3])
with FileStreamProgramCache(root) as cache:
    for i in range(misses):
        src = 'extern "C" __global__ void k%d(int* o) { o[0] = %d; }' % (i, i)
        compile_program(src, options=ProgramOptions(arch=arch), cache=cache)
"""


def _fsyncs(tmp_path, misses: int) -> int:
    out = tmp_path / f"strace-{misses}"
    root = tmp_path / f"cache-{misses}"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(out)]
        + [sys.executable, "-c", _SCRIPT, str(root), ARCH, str(misses)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KERNELCACHE_DIR": str(tmp_path / "default")},
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr.lower():
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()[:200]}")  # a container without ptrace
    assert proc.returncode == 0, proc.stderr
    return sum(1 for line in out.read_text().splitlines() if "fsync(" in line or "fdatasync(" in line)


def test_a_miss_fsyncs_once_its_artifact(tmp_path) -> None:
    # Two runs of one script, 1 miss and 3 misses: what opening the cache costs cancels out.
    assert _fsyncs(tmp_path, 3) - _fsyncs(tmp_path, 1) == 2
