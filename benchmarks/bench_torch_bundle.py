"""torch.compile on a new node from one bundle (Mega-Cache + Triton's kernels) vs the same node warm, side by side.

    PYTHONPATH=src python benchmarks/bench_torch_bundle.py               # needs torch, a GPU
    PYTHONPATH=src python benchmarks/bench_torch_bundle.py --rounds 5

The two-block model of bench_torch_fleet.py, in fresh processes, Triton's manager kernelcache's
(TRITON_CACHE_MANAGER=kernelcache.triton:KernelCacheManager), no Redis, Inductor's remote caches off:
  cold        node A, empty directories; then kernelcache.torch.save() and `kernelcache bundle create`
              of A's kernelcache directory: one read-only file with the Mega-Cache and Triton's kernels;
  local warm  node A again (its Inductor, Triton and kernelcache directories as the cold run left them);
  new node    empty directories of its own, KERNELCACHE_BUNDLES=that file, kernelcache.torch.load()
              before torch.compile (timed: it is part of the new node's first call).
Each round runs local warm and new node once (in alternating order). Prints the first call (compile +
run, after imports) best and median over the rounds, the ratio new node / local warm, Inductor's
FX-graph cache hits and misses on the new node, and the kernels the new node compiled (entries its
own kernelcache directory got: 0 when every Triton kernel came from the bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_torch_fleet import MODEL

CHILD = (
    MODEL
    + r"""
mode = sys.argv[1]
start = time.perf_counter()
loaded = None
load_s = 0.0
if mode == "new":
    import kernelcache.torch as kt
    loaded = kt.load()
load_s = time.perf_counter() - start
compiled = torch.compile(model)
with torch.no_grad():
    y = compiled(x)
torch.cuda.synchronize()
first = time.perf_counter() - start
with torch.no_grad():
    ok = torch.allclose(y, model(x), atol=1e-3, rtol=1e-3)
saved = None
if mode == "cold":
    import kernelcache.torch as kt
    saved = kt.save()
from torch._dynamo.utils import counters
fx = counters["inductor"]
print(json.dumps({"first_call": first, "load_s": load_s, "ok": bool(ok), "loaded": loaded and loaded.artifacts,
                  "saved": saved and saved.artifacts,
                  "fx_hit": fx["fxgraph_cache_hit"], "fx_miss": fx["fxgraph_cache_miss"]}))
"""
)

_DROPPED = ("PYTHONDONTWRITEBYTECODE", "KERNELCACHE_REDIS_URL", "KERNELCACHE_BUNDLES", "KERNELCACHE_OBJECT_STORE_URL")


def run_child(mode: str, node: str, bundle: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env.update(
        TRITON_CACHE_MANAGER="kernelcache.triton:KernelCacheManager",
        TORCHINDUCTOR_CACHE_DIR=os.path.join(node, "inductor"),
        TRITON_CACHE_DIR=os.path.join(node, "triton"),
        KERNELCACHE_DIR=os.path.join(node, "kernelcache"),
        TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE="0",
        TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE="0",
    )
    if bundle is not None:
        env["KERNELCACHE_BUNDLES"] = bundle
    out = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["ok"]:
        raise RuntimeError(f"{mode}: the compiled model's output differs from eager")
    return result


def entries(node: str) -> int:
    """Entries the node's own kernelcache directory holds (a kernel compiled there is one)."""
    root = os.path.join(node, "kernelcache", "v2", "entries")
    return sum(f.endswith(".meta") for _, _, files in os.walk(root) for f in files)


def make_bundle(node: str, out: str) -> None:
    args = [
        sys.executable,
        "-m",
        "kernelcache",
        "bundle",
        "create",
        out,
        "--cache-dir",
        os.path.join(node, "kernelcache"),
    ]
    subprocess.run(args, check=True, capture_output=True, timeout=300)
    os.chmod(out, 0o444)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="kc-torch-bundle-")
    try:
        node_a, bundle = os.path.join(work, "a"), os.path.join(work, "model.kcb")
        cold = run_child("cold", node_a)
        print(f"  cold        first call {cold['first_call']:.2f} s, saved {cold['saved']}", flush=True)
        make_bundle(node_a, bundle)
        times: dict[str, list[float]] = {"local warm": [], "new node": []}
        news = []
        for r in range(args.rounds):
            order = ("local warm", "new node") if r % 2 == 0 else ("new node", "local warm")
            for phase in order:
                node = node_a if phase == "local warm" else os.path.join(work, f"new-{r}")
                result = run_child(
                    "local" if phase == "local warm" else "new", node, bundle if phase == "new node" else None
                )
                times[phase].append(result["first_call"])
                if phase == "new node":
                    news.append((result, entries(node)))
                load = f" (kernelcache.torch.load {result['load_s']:.2f} s)" if phase == "new node" else ""
                print(f"  round {r + 1} {phase:<10} first call {result['first_call']:.2f} s{load}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    local, new = times["local warm"], times["new node"]
    print(f"{'first torch.compile call':<36}{'best':>8}{'median':>9}")
    print(f"{'cold (node A, empty)':<36}{cold['first_call']:>7.2f}s")
    for phase, values in times.items():
        print(f"{phase:<36}{min(values):>7.2f}s{statistics.median(values):>8.2f}s")
    ratio_best, ratio_median = min(new) / min(local), statistics.median(new) / statistics.median(local)
    print(f"{'ratio new node / local warm':<36}{ratio_best:>8.2f}{ratio_median:>9.2f}")
    print(f"within 1.1x of local warm (median): {'yes' if ratio_median <= 1.1 else 'no'}")
    hits = sorted({(r["fx_hit"], r["fx_miss"]) for r, _ in news})
    print(f"new node: Inductor FX-graph (hits, misses) {hits}; Mega-Cache loaded {news[0][0]['loaded']}")
    print(f"new node: kernels compiled there (entries of its own kernelcache dir) {[n for _, n in news]}")
    print(f"(best and median of {args.rounds} rounds; no Redis, Inductor's remote caches off)")


if __name__ == "__main__":
    main()
