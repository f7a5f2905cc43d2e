"""The rough edges an operator hit with the command line and the package, each provoked for real."""

from __future__ import annotations

import os
import subprocess
import sys


def _kc(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=env, timeout=120, **kw
    )


def test_several_bad_variables_are_one_line_each(tmp_path) -> None:
    env = {**os.environ, "KERNELCACHE_DIR": str(tmp_path), "KERNELCACHE_MAX_SIZE": "lots"}
    env.update(KERNELCACHE_WAIT_TIMEOUT="-1", KERNELCACHE_DISABLE="maybe")
    proc = _kc("stats", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 3, proc.stderr
    assert all(line.startswith("kernelcache: error: KERNELCACHE_") for line in lines)
    assert sorted(line.split()[2].split("=")[0].rstrip(":") for line in lines) == [
        "KERNELCACHE_DISABLE",
        "KERNELCACHE_MAX_SIZE",
        "KERNELCACHE_WAIT_TIMEOUT",
    ]
