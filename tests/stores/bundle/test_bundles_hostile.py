"""Bundles that are not what they claim: a FIFO at the path, an index whose slots point outside
the records (its tag recomputed, as a careless or hostile writer of an unsigned bundle would).

Real compiles, real bundles made by ``kernelcache bundle create``, real processes for anything
that could hang (a hang shows as a timeout of the child, not of the test run).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, run_python

import kernelcache
from kernelcache.stores.bundle import format as fmt

SOURCES = [f'extern "C" __global__ void h{i}(float* x) {{ x[0] = {i}.5f; }}' for i in range(3)]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


@pytest.fixture
def built(tmp_path: Path) -> dict:
    """A cache with three real compiles and the bundle `kernelcache bundle create` makes of it."""
    root = tmp_path / "cache"
    names = []
    with kernelcache.FileStreamProgramCache(root) as cache:
        for src in SOURCES:
            info = kernelcache.CompileInfo()
            kernelcache.compile_program(src, options=ProgramOptions(arch=ARCH), cache=cache, info=info)
            names.append(info.entry_name)
    proc = _cli("bundle", "create", str(tmp_path / "b.kcb"), "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "bundle": tmp_path / "b.kcb", "names": names}


def _with_index(src: Path, dst: Path, edit: Callable[[list[tuple[bytes, int, int]]], list]) -> None:
    """Copy the bundle src to dst with its index slots (name, offset, length) replaced by
    edit(slots), and the index tag recomputed, so the index itself passes its check."""
    raw = src.read_bytes()
    count, offset, length = fmt.HEADER.unpack_from(raw)[4:7]
    slots = [fmt.SLOT.unpack_from(raw, offset + i * fmt.SLOT.size) for i in range(count)]
    index = b"".join(fmt.SLOT.pack(*slot) for slot in edit(slots))
    assert len(index) == length
    dst.write_bytes(raw[:offset] + index + fmt.index_tag(None, raw[: fmt.HEADER.size], index))


def _repoint(src: Path, dst: Path, slots: dict[str, tuple[int | None, int | None]]) -> None:
    """The bundle src as dst with the named entries' (offset, length) replaced (None: kept)."""

    def edit(old: list[tuple[bytes, int, int]]) -> list[tuple[bytes, int, int]]:
        out = []
        for binary, at, size in old:
            new_at, new_size = slots.get(binary.hex(), (None, None))
            out.append((binary, at if new_at is None else new_at, size if new_size is None else new_size))
        return out

    _with_index(src, dst, edit)


def test_a_fifo_at_the_bundle_path_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "b.kcb"
    os.mkfifo(fifo)
    (tmp_path / "link.kcb").symlink_to(fifo)
    out = run_python(
        "import sys, kernelcache\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        kernelcache.BundleProgramCache(path)\n"
        "    except ValueError as exc:\n"
        "        print(type(exc).__name__, 'regular' in str(exc))\n",
        str(fifo),
        str(tmp_path / "link.kcb"),
        timeout=30,
    )
    assert out.split() == ["InvalidBundleError", "True"] * 2


def test_slots_pointing_outside_the_records_are_damage_that_verify_and_import_report(
    built: dict, tmp_path: Path
) -> None:
    size = built["bundle"].stat().st_size
    huge, past, into_header = built["names"]
    bad = tmp_path / "bad.kcb"
    _repoint(built["bundle"], bad, {huge: (None, 1 << 62), past: (size + 100, None), into_header: (0, None)})
    proc = _cli("bundle", "verify", str(bad), "--json")
    assert proc.returncode == 1, proc.stderr
    damaged = json.loads(proc.stdout)["damaged"]
    assert sorted(damaged) == sorted(built["names"]) and all("damaged" in why for why in damaged.values())
    assert _cli("bundle", "ls", str(bad)).returncode == 0
    proc = _cli("import", str(bad), "--cache-dir", str(tmp_path / "into"), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert sorted(report["damaged"]) == sorted(built["names"]) and report["records"] == 3  # the source index


def test_a_slot_with_a_huge_length_is_a_miss_in_that_tier_and_the_disk_behind_it_answers(
    built: dict, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.kcb"
    _repoint(built["bundle"], bad, {name: (None, 1 << 62) for name in built["names"]})
    bundle = kernelcache.BundleProgramCache(bad)
    disk = kernelcache.FileStreamProgramCache(built["root"])
    cache = kernelcache.TieredProgramCache([kernelcache.InMemoryProgramCache(), bundle, disk])
    infos = [kernelcache.CompileInfo() for _ in SOURCES]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for src, info in zip(SOURCES, infos):
            kernelcache.compile_program(src, options=ProgramOptions(arch=ARCH), cache=cache, info=info)
    assert [info.hit for info in infos] == [True] * 3 and cache.stats()["compiles"] == 0
    messages = [str(w.message) for w in caught if issubclass(w.category, kernelcache.KernelCacheWarning)]
    assert len(messages) == 1 and "outside the records" in messages[0]
    assert bundle.stats()["errors_by_cause"] == {"corrupt": 3}
    cache.close()


def test_bundle_create_replaces_an_older_bundle_and_nothing_else(built: dict, tmp_path: Path) -> None:
    notes, target = tmp_path / "notes.txt", tmp_path / "mine.txt"
    notes.write_text("a user's notes\n")
    target.write_text("a user's file\n")
    (tmp_path / "link.kcb").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.kcb")
    for out in ("notes.txt", "link.kcb", "fifo.kcb"):
        proc = _cli("bundle", "create", str(tmp_path / out), "--cache-dir", str(built["root"]))
        assert proc.returncode != 0 and "is not a kernelcache bundle" in proc.stderr, proc.stderr
    assert notes.read_text() == "a user's notes\n" and target.read_text() == "a user's file\n"
    assert os.path.islink(tmp_path / "link.kcb") and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    (tmp_path / "empty.kcb").touch()  # mktemp's empty file: nothing to lose
    for out in (built["bundle"], tmp_path / "empty.kcb"):
        proc = _cli("bundle", "create", str(out), "--cache-dir", str(built["root"]))
        assert proc.returncode == 0, proc.stderr
        assert len(kernelcache.BundleProgramCache(out)) == 6


def test_bundle_create_from_a_redis_it_cannot_reach_keeps_the_older_bundle(built: dict, tmp_path: Path) -> None:
    # It wrote an empty bundle over the good one, exit 0.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"  # nothing listens there
    good = built["bundle"].read_bytes()
    proc = _cli("bundle", "create", str(built["bundle"]), "--redis", url)
    assert proc.returncode != 0 and "could not be scanned" in proc.stderr, proc.stderr
    assert built["bundle"].read_bytes() == good
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_verify_reports_entries_an_index_out_of_order_hides_from_look_ups(built: dict, tmp_path: Path) -> None:
    # verify said "0 damaged" while every look-up but one missed.
    bad = tmp_path / "bad.kcb"
    _with_index(built["bundle"], bad, lambda slots: list(reversed(slots)))
    with kernelcache.BundleProgramCache(bad) as store:
        served = sum(store.read_named(name) is not None for name in store.names())
    proc = _cli("bundle", "verify", str(bad), "--json")
    damaged = json.loads(proc.stdout)["damaged"]
    assert proc.returncode == 1 and len(damaged) == 6 - served and served < 6
    assert all("out of order" in why for why in damaged.values())
