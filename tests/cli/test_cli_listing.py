"""`ls` and `stats` on many entries: what they read and what they print (the cost itself is
measured by benchmarks/bench_cli.py, never asserted here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernelcache.cli import table
from kernelcache.stores.file.store import FORMAT_DIR

# fill<float[n]>: a real name expression with brackets, which rich's markup read as a style tag.
SOURCE = """constexpr int n = 4;
template <typename T> __global__ void fill(T* p) { (*p)[0] = 1; }
"""
EXPR = "fill<float[n]>"
COPIES = 40  # the compiled record re-stored under this many more keys

# Runs one command in this process with an audit hook that records every file opened under
# the cache's entries/ tree (real opens, seen by the interpreter; nothing is replaced).
_PROBE = r"""
import json, os, sys
root, cmd = sys.argv[1], sys.argv[2:]
opened = []
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(os.environ["PROBE_TREE"]):
        opened.append(args[0])
sys.addaudithook(hook)
from kernelcache.cli.main import main
try:
    main([*cmd, "--cache-dir", root], standalone_mode=False)
finally:
    heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("rich", "cuda", "numpy", "redis")})
    print(json.dumps({"opened": opened, "heavy": heavy}), file=sys.stderr)
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> str:
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_program

    root = str(tmp_path_factory.mktemp("many"))
    cache = FileStreamProgramCache(root)
    compile_program(SOURCE, options=ProgramOptions(arch="sm_90"), cache=cache, name_expressions=[EXPR])
    # The artifact, and the source index its miss wrote (explained misses): one file each.
    (entry,) = [e for e in cache.iter_entries() if e.meta["meta"].get("kind") != "source-index"]
    with open(entry.path, "rb") as f:
        payload = f.read()
    for i in range(COPIES):
        meta = dict(entry.meta["meta"], options={"arch": "sm_80"})
        cache.set_record(b"listing-%d" % i, payload, meta)
    cache.close()
    return root


def _probe(root: str, *cmd: str) -> tuple[str, dict]:
    tree = os.path.join(root, FORMAT_DIR, "entries") + os.sep
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, root, *cmd],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PROBE_TREE": tree, "COLUMNS": "200"},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("cmd", [["ls"], ["stats"], ["ls", "--json"]])
def test_ls_and_stats_read_one_sidecar_per_entry_and_no_payload(many, cmd) -> None:
    out, seen = _probe(many, *cmd)
    assert len(seen["opened"]) == COPIES + 2  # one file per entry, the source index included
    assert all(p.endswith(".meta") for p in seen["opened"])  # the sidecar; an artifact is never read
    assert len(set(seen["opened"])) == COPIES + 2
    # rich lays a table out at about 0.5 ms a row (over a second at 2,000 entries); importing
    # cuda.core alone takes 0.25 s or more (DECISIONS.md: a store may be a cuda.core
    # ProgramCacheResource, yet ls and stats stay under 0.3 s). Neither is imported.
    assert seen["heavy"] == []


def test_ls_prints_kernel_names_as_they_are(many) -> None:
    out, _ = _probe(many, "ls")
    assert EXPR in out  # rich took "[n]" for markup and printed fill<float>
    rows = [ln for ln in out.splitlines() if "c++" in ln]
    assert (
        len(rows) == COPIES + 1 and sum("sm_80" in r for r in rows) == COPIES and sum("sm_90" in r for r in rows) == 1
    )


def test_stats_counts_entries(many) -> None:
    out, _ = _probe(many, "stats")
    line = next(ln for ln in out.splitlines() if ln.startswith("entries"))
    assert line.split() == ["entries", str(COPIES + 1)]


def test_table_folds_only_the_last_column_within_the_width() -> None:
    key = "0123456789ab"
    names = ", ".join(f"kernel_{i}<float, {i}>" for i in range(6))
    text = table.render(
        "t", ("key", "n", "kernels"), [(key, "7", names), ("k2", "12", "")], right=(1,), fold_last=14, columns=60
    )
    lines = text.splitlines()
    assert lines[0] == "t" and lines[1].split() == ["key", "n", "kernels"]
    assert all(len(ln) <= 60 for ln in lines)
    assert lines[3].startswith(key + "   7  kernel_0<float,")  # right-aligned, never shortened
    start = lines[3].index("kernel_0")
    folded = [ln for ln in lines[4:] if ln.startswith(" ")]
    assert folded and all(ln[:start].strip() == "" for ln in folded)  # under the kernels column
    assert "".join(ln[start:] for ln in [lines[3], *folded]).replace(" ", "") == names.replace(" ", "")
    assert lines[-1] == "k2".ljust(12) + "  12"  # an empty last cell leaves no trailing blanks


def test_table_cells_are_one_printable_line() -> None:
    text = table.render("t", ("a", "b"), [("x\ny", "\x1b[31mred")])
    assert "\x1b" not in text and text.splitlines()[3] == "x?y  ?[31mred"
