"""Named blobs in bundles (what carries torch.compile's Mega-Cache): written into a cache directory,
carried by `kernelcache bundle create`, read back checked; never reached by a key, not listed as an
entry, refused when of another format or when the record at the name is something else.

Real files, the real CLI in fresh processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kernelcache
from kernelcache.stores.bundle import blobs
from kernelcache.stores.bundle import format as fmt
from kernelcache.stores.naming import entry_name

NAME = "torch/mega-cache"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=os.environ, timeout=120
    )


@pytest.fixture
def carried(tmp_path: Path) -> dict:
    """A cache holding one blob (and one ordinary entry), and the bundle `bundle create` made of it."""
    data = os.urandom(50_000)
    with kernelcache.FileStreamProgramCache(tmp_path / "cache") as cache:
        cache[b"an ordinary key"] = b"\x7fELF not a blob"
        meta = blobs.blob_meta(NAME, "application/x-test", {"torch": "9.9"})
        assert cache.write_named(blobs.blob_entry_name(NAME), data, meta)
    out = tmp_path / "b.kcb"
    proc = _cli("bundle", "create", str(out), "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    return {"data": data, "bundle": out, "cache": tmp_path / "cache", "tmp": tmp_path}


def test_a_blob_in_a_cache_directory_is_carried_by_bundle_create_and_read_back_checked(carried):
    with kernelcache.BundleProgramCache(carried["bundle"]) as bundle:
        found = blobs.blob_from_record(NAME, bundle.read_named(blobs.blob_entry_name(NAME)), bundle.path)
        assert found is not None and found[0] == carried["data"]
        assert found[1]["media_type"] == "application/x-test" and found[1]["torch"] == "9.9"
        assert found[1]["blob_format"] == blobs.BLOB_FORMAT
        # No key reaches it: not its name, not the name with the domain in front.
        for key in (NAME.encode(), blobs.BLOB_DOMAIN + NAME.encode(), bytes.fromhex(blobs.blob_entry_name(NAME))):
            assert entry_name(key) != blobs.blob_entry_name(NAME) and bundle.get_record(key) is None


def test_tools_skip_a_blob_as_an_entry_and_carry_it_on(carried):
    listed = json.loads(_cli("bundle", "ls", str(carried["bundle"]), "--json").stdout)
    assert len(listed["rows"]) == 1 and listed["other_records"] == 1
    assert _cli("bundle", "verify", str(carried["bundle"])).returncode == 0
    rows = json.loads(_cli("ls", "--cache-dir", str(carried["cache"]), "--json").stdout)
    assert len(rows["entries"] if isinstance(rows, dict) else rows) == 1
    # import, then a bundle of that cache: the blob travels as it is.
    again = carried["tmp"] / "again"
    assert _cli("import", str(carried["bundle"]), "--cache-dir", str(again)).returncode == 0
    assert _cli("bundle", "create", str(carried["tmp"] / "again.kcb"), "--cache-dir", str(again)).returncode == 0
    with kernelcache.BundleProgramCache(carried["tmp"] / "again.kcb") as bundle:
        found = blobs.blob_from_record(NAME, bundle.read_named(blobs.blob_entry_name(NAME)), bundle.path)
        assert found is not None and found[0] == carried["data"]


def test_a_blob_of_another_format_or_another_record_at_its_name_is_refused_not_guessed(tmp_path):
    future = {**blobs.blob_meta(NAME, "x"), "blob_format": blobs.BLOB_FORMAT + 1}
    other = {**blobs.blob_meta("other/blob", "x")}
    records = [
        (blobs.blob_entry_name(NAME), b"from a later kernelcache", future, 1.0),
        (blobs.blob_entry_name("a/b"), b"some other blob's record", other, 1.0),
        (blobs.blob_entry_name("c/d"), b"an entry's meta", {"code_type": "c++"}, 1.0),
    ]
    path = fmt.write_bundle(tmp_path / "b.kcb", records).path
    with kernelcache.BundleProgramCache(path) as bundle, warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for name in (NAME, "a/b", "c/d"):
            assert blobs.blob_from_record(name, bundle.read_named(blobs.blob_entry_name(name)), path) is None
    texts = [str(w.message) for w in seen]
    assert any("of format 2, which this version of kernelcache does not read" in t for t in texts)
    assert sum("is not that blob; ignored" in t for t in texts) == 2


def test_a_signed_bundles_blob_is_checked_with_its_secret(tmp_path):
    secret = b"team secret"
    record = (blobs.blob_entry_name(NAME), b"mega", blobs.blob_meta(NAME, "x"), 1.0)
    path = fmt.write_bundle(tmp_path / "s.kcb", [record], secret=secret).path
    raw = bytearray(Path(path).read_bytes())
    with kernelcache.BundleProgramCache(path, secret=secret) as bundle:
        assert blobs.blob_from_record(NAME, bundle.read_named(record[0]), path)[0] == b"mega"
    raw[fmt.HEADER.size + 40] ^= 0x01  # inside the record: its HMAC no longer matches
    Path(path).write_bytes(bytes(raw))
    with kernelcache.BundleProgramCache(path, secret=secret) as bundle, warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert bundle.read_named(record[0]) is None


@pytest.mark.parametrize("bad", ["", "/abs", "a b", "x" * 129, "ünï", 7])
def test_a_blob_name_is_checked(bad):
    with pytest.raises(ValueError, match="blob name"):
        blobs.blob_entry_name(bad)
