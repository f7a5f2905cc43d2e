"""On a GPU: torch.compile of a two-block model on a new node (empty local directories, no Redis) from one
read-only bundle carrying the Mega-Cache and Triton's kernels: every Inductor graph hits and no kernel
is compiled there. Timings are benchmarks/bench_torch_bundle.py's (never a test's)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
from bench_torch_bundle import entries, make_bundle, run_child  # noqa: E402


def test_a_new_node_compiles_nothing_from_one_bundle(tmp_path):
    warm = str(tmp_path / "warm")
    cold = run_child("cold", warm)
    assert cold["fx_miss"] >= 1 and cold["saved"].get("inductor", 0) >= 1 and entries(warm) >= 1
    bundle = str(tmp_path / "model.kcb")
    make_bundle(warm, bundle)
    new_node = str(tmp_path / "new")
    new = run_child("new", new_node, bundle)
    assert new["loaded"] == cold["saved"]
    assert new["fx_hit"] == cold["fx_miss"] and new["fx_miss"] == 0
    assert entries(new_node) == 0  # no Triton kernel compiled (and stored) on the new node
