"""The hit path, side by side with cuda.core 1.2 in one run: every figure with its ratio (ours / theirs).

    PYTHONPATH=src python benchmarks/bench_hit.py                         # this tree vs cuda.core
    PYTHONPATH=src python benchmarks/bench_hit.py --rounds 6              # the issue's 6 fresh processes
    PYTHONPATH=src python benchmarks/bench_hit.py --against /tmp/old/src  # and an older tree

(a) In one process, interleaved (ours, theirs, ours, ...), medians of ``--repeat`` batches:
    make_program_cache_key vs ``cuda.core.utils.make_program_cache_key``; compile_program's
    warm hit (the full call) vs ``Program(...).compile("cubin", cache=FileStreamProgramCache(dir))``;
    a file store's ``get`` of that cubin vs cuda.core's FileStreamProgramCache ``get``.
(b) Fresh processes, alternating, medians of ``--rounds`` each, on entries an earlier process
    stored: the imports (cuda.core + kernelcache + a store, vs cuda.core + its cache), and the
    first hit after them. Also the first hit of the default cache (KERNELCACHE_DIR) with and
    without ``KERNELCACHE_REDIS_URL`` (a real redis-server on loopback, started here when
    ``redis-server`` is on PATH, or ``--redis-url``), the entry on disk: its difference, and
    whether the hit imported redis.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

ARCH = os.environ.get("BENCH_ARCH", "sm_90")
# The demo's tiled matmul (no #include: no header manifest, as in bench_cold's (e)).
SOURCE = r"""
#define TILE 16
extern "C" __global__ void matmul(const float* a, const float* b, const float* bias, float* c, int n) {
    __shared__ float ta[TILE][TILE], tb[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        ta[threadIdx.y][threadIdx.x] = a[row * n + t + threadIdx.x];
        tb[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        __syncthreads();
    }
    float v = acc + bias[col];
    c[row * n + col] = v > 0.0f ? v : 0.0f;
}
"""
REMOTE = ("redis", "obstore")  # what a hit from disk must not import


def interleaved_us(
    pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]], repeat: int, number: int
) -> dict:
    """For each figure, medians (us per call) of ``repeat`` batches of ``number`` calls, ours and
    theirs alternating batch by batch (a noisy machine slows both alike)."""
    runs: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pairs}
    for r in range(repeat):
        for name, fns in pairs.items():
            for side in (0, 1) if r % 2 == 0 else (1, 0):
                fn = fns[side]
                t = time.perf_counter()
                for _ in range(number):
                    fn()
                runs[name][side].append((time.perf_counter() - t) / number * 1e6)
    return {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in runs.items()}


def micro(root: str, repeat: int, number: int) -> None:
    """(a), in this process (PYTHONPATH picks the tree); a JSON line out."""
    from cuda.core import Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache as TheirFile
    from cuda.core.utils import make_program_cache_key as their_key

    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program, make_program_cache_key

    opts = ProgramOptions(arch=ARCH)
    ours = FileStreamProgramCache(os.path.join(root, "micro-ours"))
    theirs = TheirFile(os.path.join(root, "micro-theirs"))
    info = CompileInfo()
    obj = compile_program(SOURCE, options=opts, cache=ours, info=info)
    Program(SOURCE, "c++", options=opts).compile("cubin", cache=theirs)
    kw = {"code": SOURCE, "code_type": "c++", "options": opts, "target_type": "cubin"}
    key = their_key(**kw)
    theirs[key] = obj  # stored by both as the bytes of one cubin
    ours_get = FileStreamProgramCache(os.path.join(root, "micro-get"))
    ours_get[key] = obj
    assert ours_get.get(key) == theirs.get(key)
    got = interleaved_us(
        {
            "key": (lambda: make_program_cache_key(**kw), lambda: their_key(**kw)),
            "hit": (
                lambda: compile_program(SOURCE, options=opts, cache=ours),
                lambda: Program(SOURCE, "c++", options=opts).compile("cubin", cache=theirs),
            ),
            "get": (lambda: ours_get.get(key), lambda: theirs.get(key)),
        },
        repeat,
        number,
    )
    print(json.dumps(got))


def fresh(kind: str, root: str) -> None:
    """(b): one fresh process of ``kind`` measures its imports and first hit; a JSON line out."""
    t0 = time.perf_counter()
    if kind == "theirs":
        from cuda.core import Program, ProgramOptions
        from cuda.core.utils import FileStreamProgramCache as TheirFile

        core = time.perf_counter()
        store = TheirFile(os.path.join(root, "theirs"))
        imported = time.perf_counter()
        Program(SOURCE, "c++", options=ProgramOptions(arch=ARCH)).compile("cubin", cache=store)
        hit = True  # their cache has no hit flag: the fill process stored it
    else:
        from cuda.core import ProgramOptions

        core = time.perf_counter()
        from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

        store = FileStreamProgramCache(os.path.join(root, "ours")) if kind in ("ours", "phases") else None
        imported = time.perf_counter()
        if kind == "phases":  # the first hit in two parts: the compiler's identity, then the rest
            from kernelcache.keys.toolchain import toolchain_for

            toolchain_for("c++")
            core = time.perf_counter()  # (reused: the end of the identity's part)
        info = CompileInfo()
        compile_program(SOURCE, options=ProgramOptions(arch=ARCH), cache=store, info=info)
        hit = info.hit
    first = time.perf_counter() - imported
    if kind == "phases":
        print(json.dumps({"toolchain_ms": (core - imported) * 1e3, "rest_ms": (time.perf_counter() - core) * 1e3}))
        return
    remote = sorted({m.split(".")[0] for m in sys.modules} & set(REMOTE))
    out = {"imports_ms": (imported - t0) * 1e3, "core_ms": (core - t0) * 1e3, "first_ms": first * 1e3}
    print(json.dumps({**out, "hit": hit, "remote": remote}))


def run_child(src: str, args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("KERNELCACHE_")}
    env["PYTHONPATH"] = os.pathsep.join([src, os.path.dirname(os.path.abspath(__file__))])
    env.update(env_extra or {})
    cmd = [sys.executable, os.path.abspath(__file__), *args]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def start_redis(work: str) -> tuple[subprocess.Popen | None, str | None]:
    server = shutil.which("redis-server")
    if server is None:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", work],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.02)
    proc.kill()
    return None, None


def row(tree: str, label: str, ours: float, theirs: float | None, unit: str, target: str = "") -> None:
    ratio = f"{ours / theirs:>7.3f}" if theirs else " " * 7
    shown = f"{theirs:>10.3f}{unit}" if theirs is not None else " " * 12
    print(f"{tree:<24} {label:<44} {ours:>10.3f}{unit} {shown} {ratio}  {target}")


def measure_tree(name: str, src: str, work: str, args: argparse.Namespace, redis_url: str | None) -> None:
    root = tempfile.mkdtemp(dir=work)
    kinds = ["ours", "theirs", "default", "phases"] + (["redis"] if redis_url else [])
    envs = {kind: {"KERNELCACHE_DIR": os.path.join(root, "default")} for kind in ("default", "redis")}
    if redis_url:
        envs["redis"]["KERNELCACHE_REDIS_URL"] = redis_url
    for kind in ("ours", "theirs", "default"):  # the misses that store the entries (and write the bytecode)
        run_child(src, ["--fresh", kind, root], envs.get(kind))
    small = run_child(src, ["--micro", root, str(args.repeat), str(args.number)])
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else reversed(kinds):
            runs[kind].append(run_child(src, ["--fresh", kind, root], envs.get(kind)))
        print(f"  {name}: round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def med(kind: str, what: str) -> float:
        return statistics.median(run[what] for run in runs[kind])

    row(name, "(a) make_program_cache_key", *small["key"], "us", "target <= 0.5")
    row(name, "(a) compile_program warm hit, full call", *small["hit"], "us", "target <= 0.3")
    row(name, "(a) file store get (hit)", *small["get"], "us", "target <= 0.3")
    row(
        name,
        "(b) imports: cuda.core + ours | + theirs",
        med("ours", "imports_ms"),
        med("theirs", "imports_ms"),
        "ms",
        "target <= 1.05",
    )
    row(name, "(b)   of which cuda.core itself", med("ours", "core_ms"), med("theirs", "core_ms"), "ms")
    row(
        name,
        "(b)   the rest: kernelcache | cuda.core's cache",
        med("ours", "imports_ms") - med("ours", "core_ms"),
        med("theirs", "imports_ms") - med("theirs", "core_ms"),
        "ms",
    )
    # cuda.core's own import varies from process to process far more than the rest: the same
    # ratio with one cuda.core figure for both (the median of every child's) is the steadier one.
    core = statistics.median(run["core_ms"] for kind in ("ours", "theirs") for run in runs[kind])
    row(
        name,
        "(b)   imports, one cuda.core median for both",
        core + med("ours", "imports_ms") - med("ours", "core_ms"),
        core + med("theirs", "imports_ms") - med("theirs", "core_ms"),
        "ms",
        "target <= 1.05",
    )
    row(
        name,
        "(b) first hit after imports",
        med("ours", "first_ms"),
        med("theirs", "first_ms"),
        "ms",
        "target <= 0.3 ms",
    )
    row(name, "(b)   of which the compiler's identity", med("phases", "toolchain_ms"), None, "ms")
    row(name, "(b)   and the rest (key, store read, replay)", med("phases", "rest_ms"), None, "ms")
    row(name, "(b) first hit, default cache", med("default", "first_ms"), None, "ms")
    if redis_url:
        diff = med("redis", "first_ms") - med("default", "first_ms")
        row(
            name, "(b) first hit, default cache + Redis URL", med("redis", "first_ms"), med("default", "first_ms"), "ms"
        )
        print(f"{name:<24} {'(b)   Redis URL costs the first hit':<44} {diff:>10.3f}ms{'':>21}  target <= 1 ms")
    for kind in (k for k in kinds if k != "phases"):
        misses = sum(not run["hit"] for run in runs[kind])
        remote = sorted({m for run in runs[kind] for m in run["remote"]})
        if misses or (kind != "theirs" and remote):
            seen = remote or "nothing remote"
            print(f"{name:<24} NOTE {kind}: {misses} of {args.rounds} first calls missed; imported {seen}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", default=[], help="another tree's src/ directory to compare")
    parser.add_argument("--rounds", type=int, default=6, help="fresh processes of each kind (alternating); medians")
    parser.add_argument("--repeat", type=int, default=15, help="(a): batches per figure; medians")
    parser.add_argument("--number", type=int, default=200, help="(a): calls per batch")
    parser.add_argument("--redis-url", help="a Redis server to use (default: start redis-server if on PATH)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    trees = [("this tree", here)] + [(f"--against {p}", os.path.abspath(p)) for p in args.against]
    work = tempfile.mkdtemp(prefix="kc-bench-hit-")
    proc, redis_url = (None, args.redis_url) if args.redis_url else start_redis(work)
    try:
        print(f"{'tree':<24} {'measure':<44} {'kernelcache':>12} {'cuda.core':>12} {'ratio':>7}")
        for name, src in trees:
            measure_tree(name, src, work, args, redis_url)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)
    redis_note = "Redis: " + (redis_url or "none (no redis-server on PATH)")
    print(f"(python {sys.version.split()[0]}, arch {ARCH}, {os.cpu_count()} CPUs, medians; {redis_note})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fresh":
        fresh(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--micro":
        micro(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
