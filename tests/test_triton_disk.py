"""Disk use per Triton kernel through kernelcache is no more than Triton's own directory's,
for the same calls (tests/_triton_disk_child.py makes the calls Triton makes to compile and
then load kernels, in fresh processes). Exact counts, each inode once, as ``du`` counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from _triton_disk_child import usage  # noqa: E402

CHILD = os.path.join(os.path.dirname(__file__), "_triton_disk_child.py")
MORE = 4  # kernels measured after the first one (which also makes each cache's own tree)


def _env(root, ours: bool, binary_only: str | None) -> dict[str, str]:
    env = dict(os.environ, KERNELCACHE_DIR=str(root / "kc"), TRITON_CACHE_DIR=str(root / "triton"))
    env.pop("TRITON_CACHE_MANAGER", None)
    env.pop("TRITON_STORE_BINARY_ONLY", None)
    if ours:
        env["TRITON_CACHE_MANAGER"] = "kernelcache.triton:KernelCacheManager"
    if binary_only is not None:
        env["TRITON_STORE_BINARY_ONLY"] = binary_only
    return env


def _calls(env: dict[str, str], first: int, count: int) -> dict:
    out = subprocess.run(
        [sys.executable, CHILD, "calls", str(first), str(count)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _added_by_more_kernels(root, ours: bool, binary_only: str | None) -> dict[str, int]:
    """What MORE kernels (compiled in one process, loaded in the next) add to a cache that
    already holds one kernel."""
    env = _env(root, ours, binary_only)
    assert _calls(env, 0, 1)["compiled"] == 1
    assert _calls(env, 0, 1)["hits"] == 1
    before = usage(str(root))
    assert _calls(env, 1, MORE) == {"compiled": MORE, "hits": 0}
    assert _calls(env, 1, MORE) == {"compiled": 0, "hits": MORE}  # the warm process compiles nothing
    after = usage(str(root))
    return {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("binary_only", [None, "1", "0"], ids=["default", "binary-only", "all-irs"])
def test_disk_per_kernel_is_at_most_tritons_own(tmp_path, binary_only):
    ours = _added_by_more_kernels(tmp_path / "ours", True, binary_only)
    theirs = _added_by_more_kernels(tmp_path / "theirs", False, binary_only)
    assert ours["inodes"] <= theirs["inodes"], (ours, theirs)
    assert ours["bytes"] <= theirs["bytes"], (ours, theirs)
