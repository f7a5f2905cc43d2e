"""What a miss makes durable: the artifact it stores is fsync'ed before it is published; the source
index beside it (read only to explain a later miss, never by a hit) and the header bookkeeping
(manifest, variant, preprocessing hint: one lost costs a compile) are not. Counted with strace on
a real compile: one fsync per miss, as cuda.core's own cache makes."""

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

root, arch, misses, head = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with FileStreamProgramCache(root) as cache:
    for i in range(misses):
        src = head + 'extern "C" __global__ void k%d(int* o) { o[0] = %d; }' % (i, i)
        compile_program(src, options=ProgramOptions(arch=arch), cache=cache)
"""


def _fsyncs(tmp_path, misses: int, head: str = "") -> int:
    out = tmp_path / f"strace-{misses}-{len(head)}"
    root = tmp_path / f"cache-{misses}-{len(head)}"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(out)]
        + [sys.executable, "-c", _SCRIPT, str(root), ARCH, str(misses), head],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KERNELCACHE_DIR": str(tmp_path / "default")},
        cwd=tmp_path,
    )
    if proc.returncode != 0 and "ptrace" in proc.stderr.lower():
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()[:200]}")  # a container without ptrace
    assert proc.returncode == 0, proc.stderr
    return sum(1 for line in out.read_text().splitlines() if "fsync(" in line or "fdatasync(" in line)


def test_a_miss_fsyncs_once_its_artifact(tmp_path) -> None:
    # Two runs of one script, 1 miss and 3 misses: what opening the cache costs cancels out.
    assert _fsyncs(tmp_path, 3) - _fsyncs(tmp_path, 1) == 2


def test_a_miss_with_headers_fsyncs_once_its_artifact(tmp_path) -> None:
    # Each source reads val.h: a header pass, a manifest, its variant and a preprocessing hint
    # per miss besides the artifact, none of them fsync'ed.
    (tmp_path / "val.h").write_text("#define VAL 1\n")
    assert _fsyncs(tmp_path, 3, '#include "val.h"\n') - _fsyncs(tmp_path, 1, '#include "val.h"\n') == 2
