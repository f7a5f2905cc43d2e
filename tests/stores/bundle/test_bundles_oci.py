"""Bundles as OCI artifacts: push and pull through a real registry (Debian's docker-registry on loopback),
what a tampered or foreign artifact gets, and KERNELCACHE_BUNDLES=oci://... on an empty node.

Real compiles, real bundles made by ``kernelcache bundle create``, the real CLI and fresh processes;
request counts come from the registry's own access log.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, run_python

import kernelcache
from kernelcache.stores.bundle import format as fmt
from kernelcache.stores.bundle import oci
from kernelcache.stores.bundle.pulled import pulled_bundle
from kernelcache.stores.bundle.registry import Registry

SOURCES = [f'extern "C" __global__ void o{i}(float* x) {{ x[0] = {i}.25f; }}' for i in range(4)]

# A fresh process on an "empty node": it compiles SOURCES with whatever KERNELCACHE_* says and
# prints its hits, compiles and the files under its cache directory.
CHILD = r"""
import json, os, sys, warnings
from cuda.core import ProgramOptions
import kernelcache
sources, arch = json.loads(sys.argv[1]), sys.argv[2]
hits, caught = [], []
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for src in sources:
        info = kernelcache.CompileInfo()
        try:
            kernelcache.compile_program(src, options=ProgramOptions(arch=arch), info=info)
            hits.append(info.hit)
        except kernelcache.CacheMissError:
            hits.append("strict miss")
caught = [str(w.message) for w in seen]
root = os.environ["KERNELCACHE_DIR"]
files = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
print(json.dumps({"hits": hits, "stats": kernelcache.default_cache().stats(), "files": files, "warnings": caught}))
"""


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=full, timeout=300
    )


def _node(tmp_path: Path, name: str, env: dict[str, str], sources: list[str] = SOURCES) -> dict:
    """A fresh process with an empty cache directory of its own, compiling ``sources``."""
    root = tmp_path / name
    full = {"KERNELCACHE_DIR": str(root), **env}
    return json.loads(run_python(CHILD, json.dumps(sources), ARCH, env=full, timeout=300))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle `kernelcache bundle create` makes of a cache holding real compiles of SOURCES."""
    work = tmp_path_factory.mktemp("oci-built")
    with kernelcache.FileStreamProgramCache(work / "cache") as cache:
        for src in SOURCES:
            kernelcache.compile_program(src, options=ProgramOptions(arch=ARCH), cache=cache)
    out = work / "kernels.kcb"
    proc = _cli("bundle", "create", str(out), "--cache-dir", str(work / "cache"))
    assert proc.returncode == 0, proc.stderr
    return out


def _manifest(registry, repo: str, tag: str = "v1") -> dict:
    return json.loads(registry.get(f"/v2/{repo}/manifests/{tag}", accept=oci.MANIFEST_TYPE))


def test_a_pushed_bundle_pulls_back_byte_identical_as_one_described_layer(registry, built, tmp_path):
    proc = _cli("bundle", "push", str(built), registry.ref("team/kernels"), "--json")
    assert proc.returncode == 0, proc.stderr
    pushed = json.loads(proc.stdout)
    proc = _cli("bundle", "pull", registry.ref("team/kernels"), str(tmp_path / "out.kcb"), "--json")
    assert proc.returncode == 0, proc.stderr
    pulled = json.loads(proc.stdout)
    assert (tmp_path / "out.kcb").read_bytes() == built.read_bytes()
    assert pulled["layer"] == pushed["layer"] == "sha256:" + hashlib.sha256(built.read_bytes()).hexdigest()
    assert pulled["digest"] == pushed["digest"] and pulled["entries"] == pushed["entries"] == len(SOURCES) * 2
    manifest = _manifest(registry, "team/kernels")
    assert manifest["artifactType"] == oci.ARTIFACT_TYPE and manifest["config"]["mediaType"] == oci.EMPTY_TYPE
    [layer] = manifest["layers"]
    assert layer["mediaType"] == oci.LAYER_TYPE and layer["annotations"][oci.TITLE] == "kernels.kcb"
    notes = manifest["annotations"]
    assert notes[oci.A_ARCHS] == ARCH and pushed["archs"] == [ARCH]
    assert notes[oci.A_INDEX_TAG] == built.read_bytes()[-fmt.TAG_SIZE :].hex()
    # The same bundle gives the same manifest: pushing it again changes nothing, sends no layer.
    uploads = registry.requests("POST", "/team/kernels/blobs/uploads/")
    again = _cli("bundle", "push", str(built), registry.ref("team/kernels"), "--json")
    assert json.loads(again.stdout)["digest"] == pushed["digest"]
    assert registry.requests("POST", "/team/kernels/blobs/uploads/") == uploads


def _push_raw(
    registry,
    repo: str,
    layer_bytes: bytes,
    annotations: dict,
    layer_type: str = oci.LAYER_TYPE,
    artifact_type: str = oci.ARTIFACT_TYPE,
) -> None:
    """An artifact written by hand (another tool, or someone who edits what they push)."""
    ref = kernelcache.config.urls.oci_reference(registry.ref(repo))
    reg = Registry(registry.host)
    oci._upload(reg, ref, oci.sha256_digest(layer_bytes), len(layer_bytes), layer_bytes)
    oci._upload(reg, ref, oci.sha256_digest(oci.EMPTY), 2, oci.EMPTY)
    layer = {"mediaType": layer_type, "digest": oci.sha256_digest(layer_bytes), "size": len(layer_bytes)}
    raw = json.loads(oci.manifest_bytes(layer, annotations))
    raw["artifactType"] = artifact_type
    assert registry.put(f"/v2/{repo}/manifests/v1", json.dumps(raw).encode(), oci.MANIFEST_TYPE) == 201


def _refused(registry, repo: str, out: Path, why: str) -> None:
    proc = _cli("bundle", "pull", registry.ref(repo), str(out))
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_tampered_layer_is_refused_and_nothing_is_written(registry, built, tmp_path):
    pushed = oci.push(str(built), registry.ref("team/tampered"))
    blob = registry.blob_file(pushed["layer"])
    good = Path(blob).read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x01  # one bit, in the registry's own storage: it serves it as it is
    Path(blob).write_bytes(bytes(data))
    try:
        _refused(registry, "team/tampered", tmp_path / "out.kcb", "tampered or damaged artifact, refused")
        # The same for the default cache: the bundle is left out with a warning; a strict run misses.
        env = {"KERNELCACHE_BUNDLES": registry.ref("team/tampered"), "KERNELCACHE_REQUIRE_HIT": "1"}
        result = _node(tmp_path, "node", env, SOURCES[:1])
    finally:
        Path(blob).write_bytes(good)  # the registry keeps one blob per digest, for every repository
    assert result["hits"] == ["strict miss"]
    assert any("is not used" in w and "tampered or damaged artifact" in w for w in result["warnings"])
    assert not [f for f in result["files"] if f.startswith("oci/") and f.endswith(".kcb")]


def test_foreign_and_inconsistent_artifacts_are_refused(registry, built, tmp_path):
    good = built.read_bytes()
    tag = good[-fmt.TAG_SIZE :].hex()
    # Another tool's artifact (its own artifact type, a tarball layer): not a bundle.
    _push_raw(
        registry,
        "other/image",
        b"\x1f\x8b not ours",
        {},
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.example.thing.v1",
    )
    _refused(registry, "other/image", tmp_path / "a.kcb", "not a kernelcache bundle")
    # Our media types around bytes that are no bundle: the bundle's own checks refuse them.
    _push_raw(registry, "fake/bytes", os.urandom(4096), {oci.A_INDEX_TAG: tag})
    _refused(registry, "fake/bytes", tmp_path / "b.kcb", "not a kernelcache bundle")
    # A real bundle under a manifest that names another bundle's index tag.
    _push_raw(registry, "fake/tag", good, {oci.A_INDEX_TAG: "00" * 32})
    _refused(registry, "fake/tag", tmp_path / "c.kcb", "does not describe this bundle")
    # A bundle with one damaged record, pushed with a correct digest (push itself refuses it).
    damaged = bytearray(good)
    damaged[fmt.HEADER.size + 100] ^= 0x01
    (tmp_path / "damaged.kcb").write_bytes(bytes(damaged))
    proc = _cli("bundle", "push", str(tmp_path / "damaged.kcb"), registry.ref("fake/damaged"))
    assert proc.returncode == 2 and "damaged entries" in proc.stderr and "not pushed" in proc.stderr
    _push_raw(registry, "fake/damaged", bytes(damaged), {oci.A_INDEX_TAG: tag})
    _refused(registry, "fake/damaged", tmp_path / "d.kcb", "fail their check: refused")


def test_a_strict_run_on_an_empty_node_hits_everything_and_a_second_process_pulls_nothing(registry, built, tmp_path):
    pushed = oci.push(str(built), registry.ref("team/strict"))
    env = {"KERNELCACHE_BUNDLES": registry.ref("team/strict"), "KERNELCACHE_REQUIRE_HIT": "1"}
    blob_gets = f"/team/strict/blobs/{pushed['layer']}"
    first = _node(tmp_path, "node", env)
    assert first["hits"] == [True] * len(SOURCES) and first["stats"]["compiles"] == 0
    pulled = f"oci/u{os.getuid()}/{pushed['layer'].replace(':', '-')}.kcb"
    assert pulled in first["files"] and registry.requests("GET", blob_gets) == 1
    assert not [f for f in first["files"] if f.endswith(".tmp")]
    # A second process on the same node: one HEAD of the manifest, no download.
    heads = registry.requests("HEAD", "/team/strict/manifests/v1")
    second = json.loads(
        run_python(CHILD, json.dumps(SOURCES), ARCH, env={"KERNELCACHE_DIR": str(tmp_path / "node"), **env})
    )
    assert second["hits"] == [True] * len(SOURCES) and registry.requests("GET", blob_gets) == 1
    assert registry.requests("HEAD", "/team/strict/manifests/v1") == heads + 1
    # By digest, once pulled, not even that: no request at all.
    by_digest = f"oci://{registry.host}/team/strict@{pushed['digest']}"
    _node(tmp_path, "node2", {**env, "KERNELCACHE_BUNDLES": by_digest})
    before = len(Path(registry.log.name).read_bytes().splitlines())
    third = json.loads(
        run_python(
            CHILD,
            json.dumps(SOURCES),
            ARCH,
            env={"KERNELCACHE_DIR": str(tmp_path / "node2"), **env, "KERNELCACHE_BUNDLES": by_digest},
        )
    )
    assert third["hits"] == [True] * len(SOURCES)
    assert len(Path(registry.log.name).read_bytes().splitlines()) == before


def test_an_unreachable_registry_uses_the_bundle_last_pulled_with_one_warning(tmp_path, built):
    from registry_servers import RegistryServer, need_registry

    need_registry()
    server = RegistryServer(str(tmp_path / "reg"))
    try:
        oci.push(str(built), server.ref("team/gone"))
        env = {"KERNELCACHE_BUNDLES": server.ref("team/gone"), "KERNELCACHE_REQUIRE_HIT": "1"}
        assert _node(tmp_path, "node", env)["hits"] == [True] * len(SOURCES)
    finally:
        server.stop()
    out = json.loads(
        run_python(CHILD, json.dumps(SOURCES), ARCH, env={"KERNELCACHE_DIR": str(tmp_path / "node"), **env})
    )
    assert out["hits"] == [True] * len(SOURCES)
    assert [w for w in out["warnings"] if "cannot ask the registry" in w and "using the bundle it named last" in w]
    # Never pulled and unreachable: the tier is left out (one warning), a strict run then misses.
    none = _node(tmp_path, "empty", env, SOURCES[:1])
    assert none["hits"] == ["strict miss"] and [w for w in none["warnings"] if "cannot reach the registry" in w]


def _big_bundle(path: Path) -> Path:
    """A bundle of 24 MB (records of random bytes): a download long enough for pulls to overlap."""
    records = [(hashlib.sha256(b"%d" % i).hexdigest(), os.urandom(1 << 20), {"arch": ARCH}, 1.0) for i in range(24)]
    fmt.write_bundle(path, records)
    return path


PULLER = r"""
import json, sys
from kernelcache.stores.bundle.pulled import pulled_bundle
path = pulled_bundle(sys.argv[1], sys.argv[2])
import hashlib
print(json.dumps({"path": path, "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}))
"""


def test_processes_pulling_at_once_download_once_and_never_see_a_partial_file(registry, tmp_path):
    """Race: three processes pull one new layer at the same moment while a thread watches for the file."""
    big = _big_bundle(tmp_path / "big.kcb")
    pushed = oci.push(str(big), registry.ref("team/big"))
    want = pushed["layer"].split(":", 1)[1]
    root = tmp_path / "node"
    final = root / "oci" / f"u{os.getuid()}" / f"sha256-{want}.kcb"
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # a reader that opens the name the moment it appears
        while not stop.is_set():
            try:
                seen.append(hashlib.sha256(final.read_bytes()).hexdigest())
            except FileNotFoundError:
                pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PULLER, registry.ref("team/big"), str(root)], stdout=subprocess.PIPE, text=True
            )
            for _ in range(3)
        ]
        outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    finally:
        stop.set()
        watcher.join()
    assert all(p.returncode == 0 for p in procs)
    assert {o["sha256"] for o in outs} == {want} and {o["path"] for o in outs} == {str(final)}
    assert seen and set(seen) == {want}  # every read of the name: the whole checked file
    assert registry.requests("GET", f"/team/big/blobs/{pushed['layer']}") == 1  # single flight
    assert not [p for p in final.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_tag_that_moves_is_followed_and_the_old_pull_removed(registry, built, tmp_path):
    root = str(tmp_path / "node")
    first = oci.push(str(built), registry.ref("team/moving"))
    old = pulled_bundle(registry.ref("team/moving"), root)
    other = _big_bundle(tmp_path / "other.kcb")
    second = oci.push(str(other), registry.ref("team/moving"))
    new = pulled_bundle(registry.ref("team/moving"), root)
    assert new != old and Path(new).read_bytes() == other.read_bytes()
    assert first["layer"].split(":")[1] in old and not os.path.exists(old)  # no reference names it now
    assert second["layer"].split(":")[1] in new


def test_a_pulled_bundle_lives_in_a_directory_only_its_user_can_write(registry, built, tmp_path):
    root = tmp_path / "node"
    path = Path(pulled_bundle(oci.push(str(built), registry.ref("team/private"))["reference"], str(root)))
    assert path.parent.stat().st_mode & 0o777 == 0o700 and path.parent.stat().st_uid == os.getuid()
    os.chmod(path.parent, 0o777)
    with pytest.raises(kernelcache.UnsafeCacheDirError, match="only you can write"):
        pulled_bundle(registry.ref("team/private"), str(root))


def test_a_cache_directory_first_made_by_a_pull_is_a_cache_root_the_tools_maintain(registry, built, tmp_path):
    root = tmp_path / "node"
    pulled = Path(pulled_bundle(oci.push(str(built), registry.ref("team/first"))["reference"], str(root)))
    with kernelcache.FileStreamProgramCache(root) as cache:
        cache[b"an entry"] = b"bytes"
    for args in (("prune", "--max-size", "0"), ("clear", "--yes")):
        proc = _cli(*args, "--cache-dir", str(root))
        assert proc.returncode == 0, proc.stderr
    assert pulled.read_bytes() == built.read_bytes()  # the tools remove entries, never the pulled bundles
