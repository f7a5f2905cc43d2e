"""Object names the store refuses and odd ones it must keep apart, and a bundle made of a bucket
that fails or is larger than memory: a real S3-protocol server on loopback (moto's server mode)
and a real proxy in front of it, no patched client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from helpers import run_python
from object_servers import FaultProxy, S3Server, iter_objects, need_object_store, set_env

from kernelcache import BundleProgramCache
from kernelcache.cli.bundle import create_bundle

need_object_store()

from kernelcache import ObjectStoreProgramCache  # noqa: E402


@pytest.mark.parametrize("prefix", ["a//b/", "./", "a/./b/", "a/../", "a\nb/", "\x00/", "a\x7fb/", "//"])
def test_a_prefix_the_object_store_refuses_raises_at_once(prefix: str) -> None:
    # Accepted, each of these made every read and write raise obstore's ValueError instead.
    with pytest.raises(ValueError, match="prefix must be a relative path"):
        ObjectStoreProgramCache("s3://bucket/team", prefix=prefix)


def test_odd_characters_in_a_prefix_round_trip_each_under_its_own_objects(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_env(monkeypatch, s3.endpoint)
    bucket = s3.bucket()
    prefixes = ["a b/", "\u00fc/", "%2F/", "x?y#z/", "*/", ""]
    for prefix in prefixes:
        store = ObjectStoreProgramCache(f"s3://{bucket}/team", prefix=prefix, retry_after_s=60)
        store[b"k"] = prefix.encode() or b"none"
    for prefix in prefixes:
        store = ObjectStoreProgramCache(f"s3://{bucket}/team", prefix=prefix, retry_after_s=60)
        assert store.get(b"k") == (prefix.encode() or b"none") and len(store) == 1
        assert store.stats()["errors"] == 0
    assert len([k for k in iter_objects(s3, bucket) if "/e/" in k]) == len(prefixes)


def _bundle_of(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", "bundle", "create", str(out), "--object-store", url, "--json"],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=120,
    )


@pytest.mark.parametrize("mode", ["fail", "fail-reads"])
def test_bundle_create_from_a_bucket_it_cannot_read_to_the_end_keeps_the_older_bundle(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str
) -> None:
    # It wrote an empty (or partial) bundle over the good one, exit 0: an image shipped empty.
    set_env(monkeypatch, s3.endpoint)
    url = f"s3://{s3.bucket()}/team"
    store = ObjectStoreProgramCache(url, retry_after_s=60)
    for i in range(5):
        store[f"k{i}".encode()] = b"artifact %d" % i
    out = tmp_path / "b.kcb"
    made = _bundle_of(url, out)
    assert made.returncode == 0 and json.loads(made.stdout)["records"] == 5, made.stderr
    good = out.read_bytes()
    proxy = FaultProxy(s3.endpoint)
    set_env(monkeypatch, proxy.endpoint)
    try:
        proxy.mode = mode
        failed = _bundle_of(url, out)
        assert failed.returncode != 0, failed.stdout
        assert ("could not be listed" if mode == "fail" else "failed to read") in failed.stderr, failed.stderr
        assert out.read_bytes() == good and sorted(os.listdir(tmp_path)) == ["b.kcb"]
    finally:
        proxy.stop()


def test_bundle_create_from_a_bucket_holds_one_batch_of_records_at_a_time(
    s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    set_env(monkeypatch, s3.endpoint)
    url = f"s3://{s3.bucket()}/team"
    store = ObjectStoreProgramCache(url, retry_after_s=60)
    size, count = 1 << 20, 64
    for i in range(count):
        store[f"k{i}".encode()] = bytes([i]) * size
    tracemalloc.start()
    try:
        report = create_bundle(str(tmp_path / "b.kcb"), object_store=url)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report["records"] == count and report["skipped"] == []
    # Every record held at once was count x size (64 MiB, twice over with the decoded copies:
    # 128 MiB). The bound is half that: the S3 server runs in this process and its buffers are
    # traced too (a loaded machine, with GETs served at once, measured 43 MB).
    assert peak < count * size, peak
    with BundleProgramCache(tmp_path / "b.kcb") as bundle:
        assert bundle.get(b"k7") == bytes([7]) * size


def test_a_fifo_at_an_object_of_a_file_store_is_a_miss_not_a_hang(tmp_path: Path) -> None:
    # obstore's local store opened it and waited for a writer forever (every look-up of that key).
    out = run_python(
        "import os, sys, kernelcache\n"
        "from kernelcache.stores.naming import entry_name\n"
        "store = kernelcache.ObjectStoreProgramCache('file://' + sys.argv[1])\n"
        "store[b'other'] = b'v'\n"
        "fifo = os.path.join(sys.argv[1], 'kernelcache', 'e', entry_name(b'k'))\n"
        "os.mkfifo(fifo)\n"
        "print(store.get(b'k'), [r and r[0] for r in store.get_many([b'k', b'other'])])\n"
        "store[b'k'] = b'mine'  # the FIFO is no record of ours to replace: dropped, left in place\n"
        "print(store.get(b'k'), os.path.exists(fifo) and not os.path.isfile(fifo))\n",
        str(tmp_path / "objects"),
        timeout=60,
    )
    assert out.split("\n")[:2] == ["None [None, b'v']", "None True"]
