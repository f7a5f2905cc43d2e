"""Object names the store refuses, and odd ones it must keep apart: a real S3-protocol server on
loopback (moto's server mode), no patched client."""

from __future__ import annotations

import pytest
from object_servers import S3Server, iter_objects, need_object_store, set_env

need_object_store()

from kernelcache import ObjectStoreProgramCache  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    server = S3Server()
    yield server
    server.stop()


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
