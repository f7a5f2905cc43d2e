"""kernelcache.torch: torch.compile's Mega-Cache saved into the cache directory, carried by one bundle,
and loaded on a new node (empty local directories, no Redis) from that read-only file.

With torch absent, the module names the extra to install. With torch present (a CPU build is enough):
a real torch.compile on the CPU in fresh processes, a real `kernelcache bundle create`, and Inductor's
own counters to prove the new node's graph came from the bundle.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import run_python

from kernelcache.stores.bundle import blobs
from kernelcache.stores.bundle import format as fmt

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install 'kernelcache[torch]')")

# One process of a node: torch.compile of a small model on the CPU, then save (the warm node) or
# load first (a new node). Prints what kernelcache.torch returned and Inductor's cache counters.
NODE = r"""
import json, sys
import torch
import kernelcache.torch as kt
from torch._dynamo.utils import counters
mode = sys.argv[1]
loaded = kt.load() if mode == "new" else None
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
x = torch.randn(4, 16)
with torch.no_grad():
    ok = torch.allclose(torch.compile(model)(x), model(x), atol=1e-4)
saved = kt.save() if mode == "warm" else None
inductor = counters["inductor"]
print(json.dumps({"ok": ok, "saved": saved and saved.__dict__, "loaded": loaded and loaded.__dict__,
                  "hit": inductor["fxgraph_cache_hit"], "miss": inductor["fxgraph_cache_miss"]}))
"""


def test_without_torch_the_module_names_the_extra_to_install():
    code = "import sys; sys.modules['torch'] = None\ntry:\n import kernelcache.torch\nexcept ModuleNotFoundError as e: print(e)"
    assert "pip install 'kernelcache[torch]'" in run_python(code)


def _node(tmp_path: Path, name: str, mode: str, env: dict[str, str]) -> dict:
    node = tmp_path / name
    full = {
        "KERNELCACHE_DIR": str(node / "kernelcache"),
        "TORCHINDUCTOR_CACHE_DIR": str(node / "inductor"),
        "TRITON_CACHE_DIR": str(node / "triton"),
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "0",
        **env,
    }
    return json.loads(run_python(NODE, mode, env=full, timeout=600).strip().splitlines()[-1])


@needs_torch
def test_a_new_node_loads_inductors_graphs_from_the_bundle_the_warm_node_made(tmp_path):
    warm = _node(tmp_path, "warm", "warm", {})
    assert warm["ok"] and warm["miss"] >= 1 and warm["saved"]["artifacts"].get("inductor", 0) >= 1
    bundle = tmp_path / "model.kcb"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelcache",
            "bundle",
            "create",
            str(bundle),
            "--cache-dir",
            str(tmp_path / "warm" / "kernelcache"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    os.chmod(bundle, 0o444)  # read-only: the new node writes nothing there
    new = _node(tmp_path, "new", "new", {"KERNELCACHE_BUNDLES": str(bundle)})
    assert new["ok"] and new["loaded"]["bundle"] == str(bundle)
    assert new["loaded"]["artifacts"] == warm["saved"]["artifacts"]
    assert new["hit"] == warm["miss"] and new["miss"] == 0  # every graph the warm node compiled


@needs_torch
def test_another_torch_versions_blob_is_left_alone_with_one_warning(tmp_path):
    import kernelcache.torch as kt

    meta = blobs.blob_meta(kt.MEGA_CACHE, kt.MEDIA_TYPE, {"torch": "0.0.1", "artifacts": {}})
    path = fmt.write_bundle(tmp_path / "old.kcb", [(blobs.blob_entry_name(kt.MEGA_CACHE), b"pickle", meta, 1.0)]).path
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert kt.load(bundles=[path]) is None
    assert [w for w in seen if "saved by torch 0.0.1" in str(w.message)]
    assert kt.load(bundles=[fmt.write_bundle(tmp_path / "none.kcb", []).path]) is None  # no blob: None, quietly
