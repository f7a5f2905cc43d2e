"""A variant read back from its record is the variant written: headers, probes (parsed on first
use), first_include and a bound working directory whose name holds JSON's own punctuation; and
the paths a look-up derives for its headers at once are those derived one entry at a time."""

from __future__ import annotations

import hashlib
import random

import pytest

from kernelcache.headers import records, scan


@pytest.mark.parametrize("cwd", [None, "/tmp/a,b", 'x"y\\', '\\"]', "/p/\\\\", "/é/ü"])
def test_a_record_reads_back_as_the_variant_written(cwd) -> None:
    """The probes' text is sliced out between the headers (read from the front) and the small
    fields (read from the back): every field comes back equal, and so do the canonical bytes."""
    variant = {
        "headers": [["q", -1, "a.h", 0, "d" * 64], [0, "b/c.h", "e" * 64], ["a", 0, 'we"ird],.h', 1, "f" * 64]],
        "probes": [[-1, "q", "a.h", 0], [0, "a", 'x"],y', -1], [1, "q", "\\", 2]],
        "first_include": 1,
    }
    if cwd is not None:
        variant["cwd"] = cwd
    raw = records.variant_bytes(variant)
    got = records.variant_from_bytes(raw, hashlib.sha256(raw).hexdigest())
    assert got is not None
    assert got["headers"] == variant["headers"] and got["first_include"] == 1 and got.get("cwd") == cwd
    assert records.probes_of(got) == variant["probes"]
    assert records.variant_bytes(got) == raw


def test_a_record_under_another_digest_or_cut_short_is_no_variant() -> None:
    """The digest decides: bytes that are not the named digest's, or not a whole record, give None."""
    raw = records.variant_bytes(
        {"headers": [[0, "a.h", "d" * 64]], "probes": [[-1, "q", "a.h", 0]], "first_include": 1}
    )
    assert records.variant_from_bytes(raw, hashlib.sha256(raw + b" ").hexdigest()) is None
    for cut in (raw[:-1], raw[:-3] + b"]", b"[[]]", b"[[],1]"):
        assert records.variant_from_bytes(cut, hashlib.sha256(cut).hexdigest()) is None, cut


def _one_by_one(variant: dict, dirs: list[str]) -> list:
    first_include = variant.get("first_include", len(dirs))
    paths: list = []
    for entry in variant["headers"]:
        paths.append(scan.entry_path(entry, paths, dirs, first_include))
    return paths


@pytest.mark.parametrize("dirs", [["/src", "/inc/a", "/inc/b"], ["", "/inc/a"], ["/src"], ["/w/sub", "rel", "/x/../y"]])
def test_entry_paths_derives_what_entry_path_does(dirs) -> None:
    """Every kind of entry (quoted from the source and from a header, angle, absolute, by place,
    out of range) gets the path scan.entry_path gives it, None where that gives None."""
    rng = random.Random(len(dirs))
    for _ in range(200):
        headers: list = []
        for i in range(12):
            choice = rng.randrange(6)
            where = rng.randrange(-1, i) if i else -1
            at = rng.randrange(-1, len(dirs) + 1)
            name = rng.choice(["a.h", "sub/b.h", "../c.h", "/abs/d.h", "./e.h"])
            if choice < 2:
                headers.append(["q", where, name, at, "d" * 64])
            elif choice < 4:
                headers.append(["a", where, name, at, "d" * 64])
            else:
                headers.append([rng.randrange(-1, len(dirs) + 1), rng.choice(["x.h", "/abs/y.h"]), "d" * 64])
        variant = {"headers": headers, "first_include": 1}

        def outcome(derive, variant=variant):
            try:
                return derive(variant, dirs)
            except (TypeError, IndexError) as exc:
                return type(exc)

        assert outcome(scan.entry_paths) == outcome(_one_by_one), headers
