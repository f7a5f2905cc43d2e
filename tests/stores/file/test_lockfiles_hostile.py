"""A FIFO planted in locks/ (by a team member, or left by a tool) must not hang anyone.

Opening a FIFO read-only waits for a writer forever: compile_program (whatever its
wait_timeout), ``kernelcache clear`` and ``verify --fix`` all hung on one. Real files, real
processes (a hang shows as a timeout of the child, not of the test run).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

from helpers import ARCH, run_python

from kernelcache import FileStreamProgramCache, compile_program

CODE = 'extern "C" __global__ void k(int* p) { *p = 1; }'


def _plant_fifos(root: str) -> list[str]:
    """Compile once (creating the key's lock file), clear the entries, and put a FIFO where
    each lock file was."""
    from cuda.core import ProgramOptions

    with FileStreamProgramCache(root) as cache:
        compile_program(CODE, options=ProgramOptions(arch=ARCH), cache=cache)
        locks = sorted(glob.glob(os.path.join(root, "v2", "locks", "*.lock")))
        assert locks
        cache.clear()
    for path in locks:
        if os.path.lexists(path):
            os.unlink(path)
        os.mkfifo(path)
    return locks


def test_compile_program_does_not_hang_on_a_fifo_lock_file(tmp_path):
    root = str(tmp_path / "cache")
    locks = _plant_fifos(root)
    out = run_python(
        "import sys\n"
        "from cuda.core import ProgramOptions\n"
        "from kernelcache import CompileInfo, FileStreamProgramCache, compile_program\n"
        "i = CompileInfo()\n"
        f"compile_program({CODE!r}, options=ProgramOptions(arch={ARCH!r}),"
        " cache=FileStreamProgramCache(sys.argv[1]), info=i, wait_timeout=2)\n"
        "print('compiled', i.hit)\n",
        root,
        timeout=30,
    )
    assert out.split() == ["compiled", "False"]
    assert not any(os.path.exists(p) and not os.path.isfile(p) for p in locks)


def test_clear_and_verify_fix_do_not_hang_on_a_fifo_lock_file(tmp_path):
    root = str(tmp_path / "cache")
    for argv in (["verify", "--fix"], ["clear", "--yes"]):
        locks = _plant_fifos(root)
        proc = subprocess.run(
            [sys.executable, "-m", "kernelcache", *argv, "--cache-dir", root],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
        assert not any(os.path.lexists(p) for p in locks), argv
