"""Errors by cause: each error provoked for real (a damaged entry file, a directory where an
entry must be, a file where the staging directory must be, an entry too large, a removal
that fails) is counted under its cause, beside the total, in the counters file every process
shares; ``kernelcache stats`` shows the breakdown in text, JSON and Prometheus's format."""

from __future__ import annotations

import ast
import glob
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import warnings

import pytest
from helpers import ARCH, REPO, run_python

from kernelcache import FileStreamProgramCache, InMemoryProgramCache
from kernelcache.stats import ERROR_CAUSES, OTHER_CAUSE, public_view

SRC = pathlib.Path(REPO) / "src" / "kernelcache"
README = pathlib.Path(REPO) / "README.md"

_COMPILE = (
    "import sys, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "from cuda.core import ProgramOptions\n"
    "from kernelcache import FileStreamProgramCache, compile_program\n"
    "src = 'extern \"C\" __global__ void k(float* x) { x[0] = 1; }'\n"
    "compile_program(src, options=ProgramOptions(arch=sys.argv[2]), cache=FileStreamProgramCache(sys.argv[1]))\n"
)


def _kc(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _entry_files(root: str) -> list[str]:
    return [p for p in glob.glob(os.path.join(root, "v2", "entries", "*", "*")) if not p.endswith(".meta")]


def _prometheus_errors(root: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = _kc("stats", "--cache-dir", root, "--format", "prometheus")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    errors = families["kernelcache_errors"]
    assert errors.type == "counter"
    every = {(s.labels["tier"], s.labels["cause"]): s.value for s in errors.samples}
    assert {cause for tier, cause in every if tier == "disk"} == {*ERROR_CAUSES, "other"}  # zeros too
    return {labels: value for labels, value in every.items() if value}


def test_a_damaged_entry_file_is_counted_as_corrupt_in_every_format(tmp_path) -> None:
    root = str(tmp_path / "cache")
    run_python(_COMPILE, root, ARCH)
    (entry,) = [p for p in _entry_files(root) if pathlib.Path(p).read_bytes()[:4] == b"\x7fELF"]  # the cubin
    with open(entry, "r+b") as f:  # truncated, as a crash or a full disk would leave it
        f.truncate(os.path.getsize(entry) // 2)
    run_python(_COMPILE, root, ARCH)  # another process: a miss, the entry removed and recompiled
    data = json.loads(_kc("stats", "--cache-dir", root, "--json"))["disk"]
    assert (data["errors"], data["errors_by_cause"], data["compiles"]) == (1, {"corrupt": 1}, 2)
    assert _prometheus_errors(root) == {("disk", "corrupt"): 1.0}
    text = _kc("stats", "--cache-dir", root).splitlines()
    at = next(i for i, line in enumerate(text) if line.split()[:1] == ["errors"])
    assert text[at].split() == ["errors", "1"] and text[at + 1].split() == ["corrupt", "1"]


def test_read_write_remove_and_size_errors_land_under_their_causes(tmp_path) -> None:
    root = str(tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = FileStreamProgramCache(root, max_size_bytes=4096)
        store[b"read"] = b"r" * 100
        store[b"remove"] = b"d" * 100
        by_name = {pathlib.Path(p).read_bytes()[:1]: p for p in _entry_files(root)}
        # A directory where an entry file must be: it cannot be read, nor removed (not empty).
        for path in (by_name[b"r"], by_name[b"d"]):
            os.unlink(path)
            os.mkdir(path)
            open(os.path.join(path, "not-ours"), "w").close()
        assert store.get(b"read") is None  # read
        store.discard(b"remove")  # remove
        store[b"big"] = b"b" * 8192  # too_large: over the cap on its own
        # A file where the staging directory must be: nothing can be written.
        shutil.rmtree(os.path.join(root, "v2", "tmp"))
        open(os.path.join(root, "v2", "tmp"), "w").close()
        store[b"new"] = b"n" * 10  # write
        store.close()
    os.unlink(os.path.join(root, "v2", "tmp"))  # put back: stats refuses a tree with a file there
    os.mkdir(os.path.join(root, "v2", "tmp"), 0o700)
    want = {"read": 1, "remove": 1, "too_large": 1, "write": 1}
    data = json.loads(_kc("stats", "--cache-dir", root, "--json"))["disk"]
    assert data["errors_by_cause"] == want and data["errors"] == 4
    got = _prometheus_errors(root)
    assert got == {("disk", cause): float(n) for cause, n in want.items()}
    assert sum(got.values()) == data["errors"]  # summed by cause: every error


def test_the_memory_store_counts_by_cause_too() -> None:
    store = InMemoryProgramCache(max_size_bytes=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store[b"k"] = b"x" * 11
    s = store.stats()
    assert (s["errors"], s["errors_by_cause"]) == (1, {"too_large": 1})


# The counters file as the version before the breakdown wrote it: the magic, then these slots.
_OLD_SLOTS = (
    "hits", "misses", "stores", "evictions", "errors", "bytes_read", "bytes_written",
    "compiles", "compile_us_saved", "size_bytes", "reconciled_at", "internal_gets",
)  # fmt: skip


def test_a_counters_file_without_the_breakdown_is_read_and_stays_readable_the_old_way(tmp_path) -> None:
    root = str(tmp_path / "cache")
    FileStreamProgramCache(root).close()
    path = os.path.join(root, "v2", "stats")
    old = dict.fromkeys(_OLD_SLOTS, 0) | {"hits": 7, "errors": 3}
    with open(path, "wb") as f:
        f.write(b"KCSTATS1" + struct.pack(f"<{len(_OLD_SLOTS)}q", *old.values()))
    store = FileStreamProgramCache(root)
    s = store.stats()
    assert (s["hits"], s["errors"], s["errors_by_cause"]) == (7, 3, {OTHER_CAUSE: 3})
    store[b"k"] = b"v" * 50
    (entry,) = _entry_files(root)
    with open(entry, "r+b") as f:
        f.write(b"w")  # one byte changed: the checksum fails
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert FileStreamProgramCache(root).get(b"k") is None
    store.close()
    s = FileStreamProgramCache(root).stats()
    assert (s["errors"], s["errors_by_cause"]) == (4, {"corrupt": 1, OTHER_CAUSE: 3})
    # What a reader of the old layout reads: the old slots at their old places, the total included.
    raw = pathlib.Path(path).read_bytes()
    assert raw[:8] == b"KCSTATS1"
    old_view = dict(zip(_OLD_SLOTS, struct.unpack(f"<{len(_OLD_SLOTS)}q", raw[8 : 8 + 8 * len(_OLD_SLOTS)])))
    assert (old_view["hits"], old_view["errors"], old_view["stores"]) == (7, 4, 1)


_COUNT_ERRORS = (
    "import sys\n"
    "from kernelcache.stats import error_deltas\n"
    "from kernelcache.stores.file.counters import FileStats\n"
    "stats = FileStats(sys.argv[1])\n"
    "for _ in range(int(sys.argv[2])):\n"
    "    stats.add(**error_deltas('read'))\n"
)


def test_a_reader_never_sees_an_error_without_its_cause(tmp_path) -> None:
    """Race: two processes count errors while this one reads the counters file over and over."""
    from kernelcache.stores.file.counters import FileStats

    path, n = str(tmp_path / "stats"), 2000
    FileStats(path).close()
    env = {**os.environ, "PYTHONPATH": str(SRC.parent)}
    writers = [subprocess.Popen([sys.executable, "-c", _COUNT_ERRORS, path, str(n)], env=env) for _ in range(2)]
    reader, torn, reads = FileStats(path), 0, 0
    while any(w.poll() is None for w in writers) or reads == 0:
        snap = public_view(reader.snapshot())
        torn += OTHER_CAUSE in snap["errors_by_cause"]
        reads += 1
    assert [w.wait() for w in writers] == [0, 0]
    final = public_view(reader.snapshot())
    assert torn == 0 and (final["errors"], final["errors_by_cause"]) == (2 * n, {"read": 2 * n})


def test_every_counted_error_names_its_cause() -> None:
    """A store's warn_once counts an error: each call names its cause; nothing counts a bare total."""
    bare: list[str] = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            words = {k.arg for k in node.keywords}
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            counts = name in ("add_stats", "count", "add", "add_deferred") and "errors" in words
            if (isinstance(node.func, ast.Attribute) and name == "warn_once" and "counted_as" not in words) or counts:
                bare.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert bare == []


@pytest.mark.parametrize("cause", [*ERROR_CAUSES, OTHER_CAUSE])
def test_the_readme_names_every_cause(cause: str) -> None:
    text = README.read_text()
    assert f"`{cause}`" in text[text.index("kernelcache_errors_total") :]
