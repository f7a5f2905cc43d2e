"""OCI references as KERNELCACHE_BUNDLES and the CLI take them: parsed, checked, and kept whole
in a `:`-separated list although they hold colons of their own."""

from __future__ import annotations

import pytest

from kernelcache import config
from kernelcache.config.urls import oci_reference, split_bundle_list

DIGEST = "sha256:" + "ab" * 32


def test_references_with_ports_tags_and_digests_stay_whole_in_the_list(tmp_path, monkeypatch):
    a, b = tmp_path / "a.kcb", tmp_path / "b.kcb"
    a.write_bytes(b"")
    b.write_bytes(b"")
    refs = ["oci://127.0.0.1:5000/team/kernels:v1", f"oci://ghcr.io/org/k@{DIGEST}", f"oci://h.io:443/x/y:t@{DIGEST}"]
    monkeypatch.setenv("KERNELCACHE_BUNDLES", ":".join([str(a), refs[0], refs[1], str(b), refs[2]]))
    assert config.bundles() == (str(a), refs[0], refs[1], str(b), refs[2])
    assert split_bundle_list(refs[0], ":") == [refs[0]]


def test_a_reference_is_parsed_into_its_parts():
    ref = oci_reference(f"oci://localhost:5000/a/b-c/d_e:v1.2@{DIGEST}")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("localhost:5000", "a/b-c/d_e", "v1.2", DIGEST)
    assert str(ref) == f"oci://localhost:5000/a/b-c/d_e:v1.2@{DIGEST}"
    assert oci_reference("oci://[::1]:5000/r:t").registry == "[::1]:5000"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("oci://h.io/Team/k:v1", "is not a repository"),
        ("oci://h.io/team/k", "names no tag or digest"),
        ("oci://h.io/team/k:v1@sha1:abc", "is not a digest"),
        ("oci://h.io/team/k:-v1", "is not a tag"),
        ("oci:///team/k:v1", "is not a registry"),
        ("oci://h.io:5000:6000/team/k:v1", "is not a registry"),
    ],
)
def test_a_bad_reference_in_the_environment_names_what_is_wrong(monkeypatch, value, why):
    monkeypatch.setenv("KERNELCACHE_BUNDLES", value)
    with pytest.raises(config.ConfigError, match=why) as caught:
        config.bundles()
    assert "KERNELCACHE_BUNDLES" in str(caught.value)
