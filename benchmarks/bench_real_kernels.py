"""Real kernels nobody on the project wrote (benchmarks/kernels), side by side with cuda.core in one run.

    python benchmarks/bench_real_kernels.py                 # the 12 deep kernels (716 headers each)
    python benchmarks/bench_real_kernels.py --set all       # all 183 (171 CuPy + 12 deep)
    python benchmarks/bench_real_kernels.py --set cupy      # the 171 CuPy kernels
    python benchmarks/bench_real_kernels.py --set all --fleet 8   # and 8 processes at once, one empty dir
    python benchmarks/bench_real_kernels.py --set cupy --limit 80 --cold-rounds 3   # cold: medians of 3
    python benchmarks/bench_real_kernels.py --limit 40      # the first 40 of the set (a quick run)
    python benchmarks/bench_real_kernels.py --cpus all      # children unpinned (default: all on the same 2 CPUs)

Each phase runs in fresh processes, one per contender:
- cold: a plain ``Program.compile`` loop (no cache), cuda.core's ``FileStreamProgramCache`` used
  as its docs show for include paths (``make_program_cache_key(..., extra_digest=<digest of the
  include paths>)``), and kernelcache's ``compile_program``: the miss's cost over a plain compile;
  and per kernel (medians), the call, its compile's wall (NVRTC's part), the rest, and the calling
  thread's CPU time (NVRTC compiles on that thread: a compile that costs more CPU in one process
  than in the other shows there, as it did on the H200 host, see the README);
- warm, fresh process, all hits: the same two caches (imports excluded, reported apart; so is
  the full garbage collection the imports leave due, taken right after them in every child: it
  is a cost of the imports, and whichever contender allocates first would pay it);
- warm, repeated in one process: the best of 5 passes over all kernels, after one pass;
- fleet (``--fleet N``): N processes started together on one empty directory, each over every
  kernel: cuda.core's loop, the ``compile_program`` loop and one ``compile_many`` call; the wall
  time until the last one ends, and how many compiles ran;
- bytes: every kernelcache miss and hit is the plain compile's (corpus.same_code).
Prints each figure and the ratio ours / theirs.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "kernels"))
import corpus  # noqa: E402


def _select(bundled: str, which: str) -> list[corpus.Kernel]:
    """The kernels of set ``which`` ("deep", "cupy", "all"; "<set>:<n>": its first n)."""
    which, _, limit = which.partition(":")
    chosen = corpus.kernels(bundled, deep={"deep": True, "cupy": False, "all": None}[which])
    return chosen[: int(limit)] if limit else chosen


def _read_once(dirs: set[str]) -> None:
    """Every file under ``dirs`` read once, untimed: the cold phase's first contender would
    otherwise pay the page cache's misses for all three (a toolkit's headers on a fresh host)."""
    for top in dirs:
        for folder, _, files in os.walk(top):
            for name in files:
                try:
                    with open(os.path.join(folder, name), "rb") as f:
                        while f.read(1 << 20):
                            pass
                except OSError:
                    pass


_COMPILES: list[float] = []  # a cold child's compile walls, one per miss (NVRTC's part of each call)


def _per_kernel(run, kernels: list[corpus.Kernel]) -> tuple[list, dict[str, float]]:  # noqa: ANN001
    """Each kernel through ``run``, with the medians of the cold detail: a call's wall, its
    compile's wall, the rest, and the calling thread's CPU time (NVRTC compiles on it)."""
    got, walls, cpus = [], [], []
    for k in kernels:
        t, c = time.perf_counter(), time.thread_time()
        got.append(run(k))
        walls.append(time.perf_counter() - t)
        cpus.append(time.thread_time() - c)
    compiles = _COMPILES if len(_COMPILES) == len(kernels) else walls  # plain: the call is the compile
    med = statistics.median
    return got, {
        "call_ms": med(walls) * 1e3,
        "compile_ms": med(compiles) * 1e3,
        "outside_ms": med(w - c for w, c in zip(walls, compiles)) * 1e3,
        "cpu_ms": med(cpus) * 1e3,
    }


def _theirs(cache, kernel: corpus.Kernel) -> tuple[bytes, bool]:  # noqa: ANN001
    """cuda.core's cache the way its docs show for include paths: (bytes, hit)."""
    from cuda.core import ObjectCode, Program, ProgramOptions
    from cuda.core.utils import make_program_cache_key

    options = ProgramOptions(**kernel.options)
    paths = "\0".join(options.include_path or []).encode()
    key = make_program_cache_key(
        code=kernel.code,
        code_type="c++",
        options=options,
        target_type="cubin",
        name_expressions=kernel.name_expressions,
        extra_digest=hashlib.sha256(paths).digest(),
    )
    data = cache.get(key)
    if data is not None:
        return bytes(ObjectCode.from_cubin(data).code), True
    program = Program(kernel.code, "c++", options=options)
    start = time.perf_counter()
    try:
        obj = program.compile("cubin", name_expressions=kernel.name_expressions)
    finally:
        program.close()
        _COMPILES.append(time.perf_counter() - start)
    cache[key] = obj
    return bytes(obj.code), False


def _ours(cache, kernel: corpus.Kernel) -> tuple[bytes, bool]:  # noqa: ANN001
    from cuda.core import ProgramOptions

    from kernelcache import CompileInfo, compile_program

    info = CompileInfo()
    obj = compile_program(
        kernel.code,
        cache=cache,
        options=ProgramOptions(**kernel.options),
        name_expressions=kernel.name_expressions,
        info=info,
    )
    if not info.hit:
        _COMPILES.append(info.compile_seconds)
    return bytes(obj.code), info.hit


def child(who: str, phase: str, which: str, work: str) -> None:
    """One contender, one phase, in this fresh process; a JSON line out."""
    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    from cuda.core.utils import FileStreamProgramCache as TheirFile

    from kernelcache import FileStreamProgramCache

    kernels = _select(corpus.bundled_headers(os.path.join(work, "bundled")), which)
    imported = time.perf_counter()
    gc.collect()  # the collection the imports left due (see the module's docstring)
    if phase == "fleet":
        return _fleet_child(who, kernels, work)
    if who == "plain":
        cache, run = None, lambda k: (corpus.plain_compile(k), False)
    elif who == "theirs":
        cache = TheirFile(os.path.join(work, "theirs"))
        run = lambda k: _theirs(cache, k)  # noqa: E731
    else:
        cache = FileStreamProgramCache(os.path.join(work, "ours"))
        run = lambda k: _ours(cache, k)  # noqa: E731
    start = time.perf_counter()
    got, detail = _per_kernel(run, kernels)
    seconds = time.perf_counter() - start
    passes = []
    if phase == "repeat":
        for _ in range(5):
            t = time.perf_counter()
            got = [run(k) for k in kernels]
            passes.append(time.perf_counter() - t)
    if who in ("plain", "ours") and phase in ("cold", "warm"):
        out = os.path.join(work, "bytes", f"{who}-{phase}")
        os.makedirs(out, exist_ok=True)
        for i, (data, _) in enumerate(got):
            with open(os.path.join(out, str(i)), "wb") as f:
                f.write(data)
    hits = sum(hit for _, hit in got)
    print(
        json.dumps(
            {
                "seconds": seconds,
                "best_pass": min(passes, default=seconds),
                "hits": hits,
                "imports": imported - t0,
                "n": len(kernels),
                **detail,
            }
        )
    )


def _fleet_child(who: str, kernels: list[corpus.Kernel], work: str) -> None:
    """One process of a fleet: every kernel through ``who``'s cache in ``work``/fleet-``who``."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_many

    where = os.path.join(work, f"fleet-{who}")
    if who == "theirs":
        from cuda.core.utils import FileStreamProgramCache as TheirFile

        cache = TheirFile(where)
        compiled = sum(not _theirs(cache, k)[1] for k in kernels)
    elif who == "ours":
        cache = FileStreamProgramCache(where)
        compiled = sum(not _ours(cache, k)[1] for k in kernels)
    else:
        requests = [
            {"code": k.code, "options": ProgramOptions(**k.options), "name_expressions": k.name_expressions}
            for k in kernels
        ]
        compile_many(requests, cache=FileStreamProgramCache(where))
        compiled = -1  # counted by the store (its counters are the directory's, all processes')
    print(json.dumps({"compiles": compiled}))


def _fleet(n: int, which: str, work: str) -> dict[str, tuple[float, int]]:
    """Per contender: (wall seconds until the last of ``n`` processes ends, compiles they ran)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = {}
    for who in ("theirs", "ours", "many"):
        args = [sys.executable, os.path.abspath(__file__), "--child", who, "fleet", which, work]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)
        ]
        results = [p.communicate(timeout=3600) for p in procs]
        wall = time.perf_counter() - start
        for p, (_stdout, stderr) in zip(procs, results):
            if p.returncode:
                raise SystemExit(f"fleet {who} failed:\n{stderr}")
        if who == "theirs":
            compiled = sum(json.loads(o.strip().splitlines()[-1])["compiles"] for o, _ in results)
        else:
            from kernelcache import FileStreamProgramCache

            compiled = FileStreamProgramCache(os.path.join(work, f"fleet-{who}")).stats()["compiles"]
        out[who] = (wall, compiled)
    return out


def _cold(rounds: int, which: str, work: str) -> dict[str, dict]:
    """Per contender, its cold phase with the median seconds of ``rounds`` (``"rounds"``: each).
    The first round runs in ``work``, whose caches the warm phases use; the others in empty
    directories beside it, the order reversed every other round (a noisy host slows all alike)."""
    runs: dict[str, list[dict]] = {}
    order = ("plain", "theirs", "ours")
    for r in range(rounds):
        where = work
        if r:
            where = tempfile.mkdtemp(dir=work)
            os.symlink(os.path.join(work, "bundled"), os.path.join(where, "bundled"))
        for who in order if r % 2 == 0 else order[::-1]:
            runs.setdefault(who, []).append(_run(who, "cold", which, where))
    return {
        who: {
            **got[0],
            **{k: statistics.median(g[k] for g in got) for k in ("seconds", *_DETAIL)},
            "rounds": [g["seconds"] for g in got],
        }
        for who, got in runs.items()
    }


# The cold detail (medians per kernel over a contender's rounds' medians): where a miss's time goes.
_DETAIL = {
    "call_ms": "a call",
    "compile_ms": "its compile",
    "outside_ms": "outside the compile",
    "cpu_ms": "calling thread's CPU",
}


# The CPUs every cold and warm child runs on (--cpus; None: wherever the scheduler puts it). On the
# H200 host (a VM) one CPU compiles up to 1.6x slower than another, the same CPU each time (a plain
# loop of 40 CuPy kernels pinned to each of 6 CPUs in turn, twice: 3.0-3.2 s on three, 3.6-5.0 s on
# the others): unpinned, a contender's time was that of the CPU it landed on, and contenders whose
# compiles are the same differed by 1.4x between processes. Pinned, all run on the same CPUs.
_PIN: set[int] | None = None


def _pinned() -> None:
    if _PIN is not None:
        os.sched_setaffinity(0, _PIN)


def _pin_set(spec: str) -> set[int] | None:
    """--cpus: "all" (no pinning), N (the first N CPUs this process may use), or a list "0,3"."""
    if spec == "all":
        return None
    usable = sorted(os.sched_getaffinity(0))
    if "," in spec:
        return {int(c) for c in spec.split(",")}
    return set(usable[: int(spec)])


def _run(who: str, phase: str, which: str, work: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    args = [sys.executable, os.path.abspath(__file__), "--child", who, phase, which, work]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=3600, preexec_fn=_pinned)
    if proc.returncode:
        raise SystemExit(f"{who} {phase} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=["deep", "cupy", "all"], default="deep")
    parser.add_argument("--rounds", type=int, default=3, help="warm children per contender (best of them)")
    parser.add_argument(
        "--cold-rounds",
        type=int,
        default=1,
        help="cold phases per contender on empty caches, order alternating (medians)",
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N kernels of the set")
    parser.add_argument("--fleet", type=int, default=0, help="also N processes at once on one empty directory")
    parser.add_argument(
        "--cpus",
        default="2",
        help="CPUs each cold and warm child is pinned to, the same for every contender: N (the first N "
        "usable), a list 0,3, or all (unpinned); 2 leaves kernelcache's header pass a core beside the "
        "compile. The fleet is never pinned",
    )
    args = parser.parse_args()
    global _PIN
    _PIN = _pin_set(args.cpus)
    which = f"{args.set}:{args.limit}" if args.limit else args.set
    work = tempfile.mkdtemp(prefix="kc-bench-real-")
    fleet: dict[str, tuple[float, int]] = {}
    try:
        chosen = _select(corpus.bundled_headers(os.path.join(work, "bundled")), which)
        n = len(chosen)
        _read_once({d for k in chosen for d in k.options["include_path"]})
        print(f"{n} kernels ({which}); cold phase...", file=sys.stderr, flush=True)
        cold = _cold(args.cold_rounds, which, work)
        warm: dict[str, dict] = {}
        for r in range(args.rounds):
            for who in ("theirs", "ours") if r % 2 == 0 else ("ours", "theirs"):
                for phase in ("warm", "repeat"):
                    got = _run(who, phase, which, work)
                    best = warm.setdefault(f"{who}-{phase}", got)
                    for k in ("seconds", "best_pass", "imports"):
                        best[k] = min(best[k], got[k])
        wrong = []
        for i in range(n):
            with open(os.path.join(work, "bytes", "plain-cold", str(i)), "rb") as f:
                plain = f.read()
            for phase in ("cold", "warm"):
                with open(os.path.join(work, "bytes", f"ours-{phase}", str(i)), "rb") as f:
                    if not corpus.same_code(f.read(), plain):
                        wrong.append((i, phase))
        if args.fleet:
            print(f"fleet of {args.fleet} processes...", file=sys.stderr, flush=True)
            fleet = _fleet(args.fleet, which, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        ("cold: miss vs plain compile (s)", cold["ours"]["seconds"], cold["plain"]["seconds"]),
        ("cold: miss vs cuda.core cache miss (s)", cold["ours"]["seconds"], cold["theirs"]["seconds"]),
        (
            "warm, fresh process, all hits (ms)",
            warm["ours-warm"]["seconds"] * 1e3,
            warm["theirs-warm"]["seconds"] * 1e3,
        ),
        (
            "warm, repeated in one process (ms)",
            warm["ours-repeat"]["best_pass"] * 1e3,
            warm["theirs-repeat"]["best_pass"] * 1e3,
        ),
        ("imports, fresh process (ms)", warm["ours-warm"]["imports"] * 1e3, warm["theirs-warm"]["imports"] * 1e3),
    ]
    if args.cold_rounds > 1:
        shown = ", ".join(f"{who} {[round(x, 2) for x in got['rounds']]}" for who, got in cold.items())
        print(f"cold rounds (s, medians below): {shown}")
    print(f"{'measure':<42} {'kernelcache':>12} {'other':>12} {'ratio':>7}")
    for label, ours, theirs in rows:
        print(f"{label:<42} {ours:>12.2f} {theirs:>12.2f} {ours / theirs:>7.2f}")
    for key, what in _DETAIL.items():
        label = f"cold, per kernel: {what} (ms)"
        ours_v, theirs_v = cold["ours"][key], cold["theirs"][key]
        print(f"{label:<42} {ours_v:>12.2f} {theirs_v:>12.2f} {ours_v / theirs_v:>7.2f}")
    for who, label in (("ours", "compile_program loop"), ("many", "compile_many")):
        if fleet:
            (ours_s, ours_c), (theirs_s, theirs_c) = fleet[who], fleet["theirs"]
            label = f"fleet x{args.fleet}: {label} (s)"
            ratio = ours_s / theirs_s
            print(f"{label:<42} {ours_s:>12.2f} {theirs_s:>12.2f} {ratio:>7.2f}  compiles {ours_c} vs {theirs_c}")
    ours_ms, theirs_ms = warm["ours-warm"]["seconds"] * 1e3, warm["theirs-warm"]["seconds"] * 1e3
    print(
        f"fresh all hits vs 2x cuda.core + 1 ms/kernel: {ours_ms:.1f} ms vs {2 * theirs_ms + n:.1f} ms "
        f"({'met' if ours_ms <= 2 * theirs_ms + n else 'NOT met'}); vs 3x: {ours_ms / theirs_ms:.2f}x"
    )
    hits = (warm["ours-warm"]["hits"], warm["theirs-warm"]["hits"])
    print(f"hits on the warm run: kernelcache {hits[0]}/{n}, cuda.core {hits[1]}/{n}")
    print(f"bytes differing from a plain compile: {len(wrong)} of {2 * n} (misses and hits) {wrong[:10]}")
    pinned = "unpinned" if _PIN is None else f"cold and warm children on CPUs {sorted(_PIN)}"
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {pinned}, warm figures best of {args.rounds})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
    else:
        main()
