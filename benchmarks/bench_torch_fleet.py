"""torch.compile on a new node: kernelcache as Triton's manager vs Triton's own, side by side in one run.

    PYTHONPATH=src python benchmarks/bench_torch_fleet.py                 # needs torch, a GPU, redis-server
    PYTHONPATH=src python benchmarks/bench_torch_fleet.py --redis-server /path/to/redis-server --rounds 2

A small model (linear layers, GELU, layer norm, softmax attention) is compiled with torch.compile in
fresh processes, and the first call (compile + run) is timed. The "fleet" is one redis-server this
script starts on a loopback port; every run sets Inductor's FX-graph and AOT-autograd remote caches
on it (TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE=1, TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE=1). For each side
(Triton's own manager; kernelcache's KernelCacheManager with KERNELCACHE_REDIS_URL on the same server):
  cold        the first node: empty Redis, empty local directories;
  new node    another node: fresh local directories (Inductor's, Triton's, kernelcache's), Redis as the
              first node left it;
  warm        the first node again: its local directories and Redis.
Each round flushes Redis between the sides. Inductor bundles the Triton kernels it finds in Triton's
own cache directory into its FX-graph entries (TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE, on by
default); --no-bundle turns that off, as when the graphs differ but their kernels do not.
Prints each figure (best of the rounds) and the ratio
kernelcache / Triton's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# The model every torch benchmark compiles (bench_torch_bundle.py too): two attention + MLP blocks.
MODEL = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
torch.manual_seed(0)

class Block(torch.nn.Module):
    def __init__(self, d=256, h=4):
        super().__init__()
        self.h, self.norm = h, torch.nn.LayerNorm(d)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.h, d // self.h).unbind(2)
        att = torch.softmax((q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / (d // self.h) ** 0.5, -1)
        x = x + self.out((att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm(x))

model = torch.nn.Sequential(Block(), Block()).cuda()
x = torch.randn(8, 128, 256, device="cuda")
"""

CHILD = MODEL + r"""
imported = time.perf_counter()
compiled = torch.compile(model)
with torch.no_grad():
    y = compiled(x)
torch.cuda.synchronize()
first = time.perf_counter() - imported
with torch.no_grad():
    ok = torch.allclose(y, model(x), atol=1e-3, rtol=1e-3)
print(json.dumps({"imports": imported - t0, "first_call": first, "ok": bool(ok)}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(binary: str, port: int, work: str) -> subprocess.Popen[bytes]:
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{binary} did not start on port {port}")


def flush(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"FLUSHALL\r\n")
        assert s.recv(16).startswith(b"+OK")


def run_child(side: str, node: str, port: int, bundle: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(
        TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE="1" if bundle else "0",
        TORCHINDUCTOR_CACHE_DIR=os.path.join(node, "inductor"),
        TRITON_CACHE_DIR=os.path.join(node, "triton"),
        TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE="1",
        TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE="1",
        TORCHINDUCTOR_REDIS_HOST="127.0.0.1",
        TORCHINDUCTOR_REDIS_PORT=str(port),
    )
    if side == "kernelcache":
        env.update(
            TRITON_CACHE_MANAGER="kernelcache.triton:KernelCacheManager",
            KERNELCACHE_DIR=os.path.join(node, "kernelcache"),
            KERNELCACHE_REDIS_URL=f"redis://127.0.0.1:{port}/0",
        )
    else:
        env.pop("TRITON_CACHE_MANAGER", None)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{side} child failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if not result["ok"]:
        raise RuntimeError(f"{side}: the compiled model's output differs from eager")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--no-bundle",
        action="store_true",
        help="TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE=0: Inductor's entries do not carry Triton's kernels",
    )
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="kc-torch-fleet-")
    port = free_port()
    server = start_redis(args.redis_server, port, work)
    best: dict[tuple[str, str], float] = {}
    try:
        for r in range(args.rounds):
            for side in ("triton", "kernelcache"):
                flush(port)
                first, other = (os.path.join(work, f"{side}-{r}-{n}") for n in ("a", "b"))
                for phase, node in (("cold", first), ("new node", other), ("warm", first)):
                    seconds = run_child(side, node, port, not args.no_bundle)["first_call"]
                    best[(side, phase)] = min(best.get((side, phase), float("inf")), seconds)
                    print(f"  round {r + 1} {side:<11} {phase:<8} first call {seconds:.2f} s", flush=True)
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'first torch.compile call':<34}{'kernelcache':>12}{'Triton own':>12}{'ratio':>8}")
    for phase in ("cold", "new node", "warm"):
        ours, theirs = best[("kernelcache", phase)], best[("triton", phase)]
        print(f"{phase:<34}{ours:>11.2f}s{theirs:>11.2f}s{ours / theirs:>8.2f}")
    bundled = "without" if args.no_bundle else "with"
    print(f"(best of {args.rounds} rounds; Inductor's FX-graph/AOT caches on Redis in both columns,")
    print(f" {bundled} Triton's kernels in its entries)")


if __name__ == "__main__":
    main()
