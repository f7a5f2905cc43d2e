"""Bundles as OCI artifacts: ``bundle push`` and ``bundle pull`` (registry.py reaches the registry).

The artifact, as the OCI image spec (1.1) describes one file (what ``oras push`` makes)::

    manifest     application/vnd.oci.image.manifest.v1+json, artifactType ARTIFACT_TYPE
      config     the empty descriptor (application/vnd.oci.empty.v1+json: ``{}``)
      layers     one: LAYER_TYPE, the bundle file byte for byte, titled with its file name
      annotations  the bundle's index tag (hex), the archs its entries are for (sm_90,sm_100),
                 its entry count and whether it is signed

The same bundle gives the same manifest (no timestamps), so pushing it again changes nothing.
A pull checks, in this order, and refuses as a damaged bundle is refused (InvalidBundleError):
the manifest's bytes against the digest asked for; that it is one of ours (artifact type, one
layer of LAYER_TYPE); the layer's bytes against its digest and size, as they arrive; then the
bundle's own checks (header, index tag and every record: BundleProgramCache); and its index tag
against the manifest's. Only then does the file get its name.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any, BinaryIO

from kernelcache.config.urls import OciReference, oci_reference
from kernelcache.stores.bundle import blobs
from kernelcache.stores.bundle import format as fmt
from kernelcache.stores.bundle.registry import Registry, RegistryError
from kernelcache.stores.bundle.store import BundleProgramCache

ARTIFACT_TYPE = "application/vnd.kernelcache.bundle.v1"
LAYER_TYPE = "application/vnd.kernelcache.bundle.layer.v1"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"
TITLE = "org.opencontainers.image.title"
A_INDEX_TAG = "dev.kernelcache.bundle.index-tag"
A_ARCHS = "dev.kernelcache.bundle.archs"
A_ENTRIES = "dev.kernelcache.bundle.entries"
A_SIGNED = "dev.kernelcache.bundle.signed"
MAX_MANIFEST_BYTES = 4 << 20  # the distribution spec lets registries refuse larger ones
_CHUNK = 1 << 20


class ArtifactError(fmt.InvalidBundleError):
    """The artifact is not a kernelcache bundle, or its bytes are not the ones its manifest names."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _scope(ref: OciReference, push: bool = False) -> str:
    return f"repository:{ref.repository}:{'pull,push' if push else 'pull'}"


# -- push -----------------------------------------------------------------------------------


def push(path: str, reference: str, *, secret: bytes | None = None, registry: Registry | None = None) -> dict[str, Any]:
    """Push the bundle at ``path`` to ``reference`` (``oci://REGISTRY/REPO:TAG``); what was pushed.

    The bundle is checked first, every record (a damaged one is never pushed: InvalidBundleError);
    a layer the registry already holds is not sent again."""
    ref = oci_reference(reference)
    if ref.tag is None:
        raise ValueError(f"{reference}: give a tag to push to (oci://REGISTRY/REPO:TAG)")
    with BundleProgramCache(path, secret=secret) as bundle:
        damaged = bundle.damaged()
        if damaged:
            raise fmt.InvalidBundleError(
                f"{bundle.path} has {len(damaged)} damaged entries "
                f"(`kernelcache bundle verify {bundle.path}`): not pushed"
            )
        archs = _archs(bundle)
        annotations = {
            A_INDEX_TAG: bundle.index_tag.hex(),
            A_ARCHS: ",".join(archs),
            A_ENTRIES: str(len(bundle)),
            A_SIGNED: "true" if bundle.signed else "false",
        }
        real = bundle.path
    reg = registry or Registry(ref.registry)
    # Race: a bundle rewritten between the digest and the upload (bundle create renames a new
    # file over it) reaches the registry as other bytes than the digest names: the registry
    # refuses the upload (it checks the digest), and nothing is tagged.
    layer_digest, size = _file_digest(real)
    with open(real, "rb") as f:
        _upload(reg, ref, layer_digest, size, f)
    _upload(reg, ref, sha256_digest(EMPTY), len(EMPTY), EMPTY)
    layer = {
        "mediaType": LAYER_TYPE,
        "digest": layer_digest,
        "size": size,
        "annotations": {TITLE: os.path.basename(real)},
    }
    raw = manifest_bytes(layer, annotations)
    headers = {"Content-Type": MANIFEST_TYPE}
    reg.open("PUT", f"/v2/{ref.repository}/manifests/{ref.tag}", _scope(ref, True), data=raw, headers=headers).close()
    return {
        "reference": str(ref),
        "digest": sha256_digest(raw),
        "layer": layer_digest,
        "bytes": size,
        "archs": archs,
        "entries": int(annotations[A_ENTRIES]),
        "signed": annotations[A_SIGNED] == "true",
    }


def manifest_bytes(layer: dict[str, Any], annotations: dict[str, str]) -> bytes:
    """The manifest of a bundle artifact (keys in one order: the same bundle, the same bytes)."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": sha256_digest(EMPTY), "size": len(EMPTY), "data": "e30="},
        "layers": [layer],
        "annotations": annotations,
    }
    return json.dumps(manifest, separators=(",", ":")).encode()


def _archs(bundle: BundleProgramCache) -> list[str]:
    """Every arch the bundle's entries are for (as ``ls`` reads it: options.arch, else arch)."""
    found = set()
    for _name, _length, head in bundle.heads():
        meta = (head or {}).get("meta")
        if not isinstance(meta, dict) or blobs.is_blob(meta):
            continue
        options = meta.get("options") if isinstance(meta.get("options"), dict) else {}
        arch = options.get("arch") or meta.get("arch")
        if isinstance(arch, str) and arch.strip("'") not in ("", "?"):
            found.add(arch.strip("'"))
    return sorted(found)


def _file_digest(path: str) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def _upload(reg: Registry, ref: OciReference, digest: str, size: int, data: bytes | BinaryIO) -> None:
    """The blob ``digest`` into the repository, unless it is there already (POST, then one PUT)."""
    scope = _scope(ref, True)
    try:
        reg.open("HEAD", f"/v2/{ref.repository}/blobs/{digest}", scope).close()
        return
    except RegistryError as exc:
        if exc.status != 404:
            raise
    with reg.open("POST", f"/v2/{ref.repository}/blobs/uploads/", scope, data=b"") as started:
        location = started.headers.get("Location")
    if not location:
        raise RegistryError(f"the registry {ref.registry} started an upload without saying where (no Location)")
    # The Location is a path on the registry or a URL (its own host, or another it sends uploads to).
    path = location if "://" in location else reg.url(location if location.startswith("/") else "/" + location)
    sep = "&" if "?" in path else "?"
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
    reg.open("PUT", f"{path}{sep}digest={digest}", scope, data=data, headers=headers).close()


# -- pull -----------------------------------------------------------------------------------


def fetch_manifest(reg: Registry, ref: OciReference) -> tuple[bytes, str]:
    """(bytes, digest) of the manifest ``ref`` names; by digest, checked against it."""
    which = ref.digest or ref.tag
    headers = {"Accept": MANIFEST_TYPE}
    with reg.open("GET", f"/v2/{ref.repository}/manifests/{which}", _scope(ref), headers=headers) as answer:
        raw = answer.read(MAX_MANIFEST_BYTES + 1)
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ArtifactError(f"{ref}: the manifest is larger than {MAX_MANIFEST_BYTES} bytes: not a kernelcache bundle")
    digest = sha256_digest(raw)
    if ref.digest is not None and digest != ref.digest:
        raise ArtifactError(f"{ref}: the registry sent a manifest whose digest is {digest}: refused")
    return raw, digest


def resolve(reg: Registry, ref: OciReference) -> str:
    """The digest of the manifest ``ref`` names (a HEAD where the registry says it, else a GET)."""
    if ref.digest is not None:
        return ref.digest
    headers = {"Accept": MANIFEST_TYPE}
    with reg.open("HEAD", f"/v2/{ref.repository}/manifests/{ref.tag}", _scope(ref), headers=headers) as answer:
        said = answer.headers.get("Docker-Content-Digest") or ""
    if said.startswith("sha256:") and len(said) == 71:
        return said
    return fetch_manifest(reg, ref)[1]


def bundle_layer(raw: bytes, where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(layer descriptor, annotations) of a bundle artifact's manifest; ArtifactError for any other."""
    try:
        manifest = json.loads(raw)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
        raise ArtifactError(f"{where} is not an OCI manifest: not a kernelcache bundle")
    kind = manifest.get("artifactType") or (manifest.get("config") or {}).get("mediaType")
    layers = manifest.get("layers")
    if kind != ARTIFACT_TYPE or not isinstance(layers, list) or len(layers) != 1:
        raise ArtifactError(
            f"{where} is an artifact of type {kind!r} with {len(layers) if isinstance(layers, list) else 'no'} "
            f"layers, not a kernelcache bundle ({ARTIFACT_TYPE}, one layer)"
        )
    layer = layers[0]
    ok = isinstance(layer, dict) and layer.get("mediaType") == LAYER_TYPE
    digest, size = (layer.get("digest"), layer.get("size")) if ok else (None, None)
    if not ok or not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise ArtifactError(f"{where}: its layer is not a kernelcache bundle ({LAYER_TYPE}, a sha256 digest)")
    if not isinstance(size, int) or size < 0:
        raise ArtifactError(f"{where}: its layer has no size")
    notes = manifest.get("annotations") if isinstance(manifest.get("annotations"), dict) else {}
    return layer, {str(k): str(v) for k, v in notes.items()}


def download(reg: Registry, ref: OciReference, layer: dict[str, Any], staged: str) -> None:
    """The layer's bytes into the new file ``staged``, checked against its digest and size."""
    h, got, size = hashlib.sha256(), 0, int(layer["size"])
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with (
        os.fdopen(fd, "wb") as out,
        reg.open("GET", f"/v2/{ref.repository}/blobs/{layer['digest']}", _scope(ref)) as answer,
    ):
        for chunk in _chunks(answer, size + 1):  # one byte more than named: a longer layer is refused
            h.update(chunk)
            out.write(chunk)
            got += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    if got != size or "sha256:" + h.hexdigest() != layer["digest"]:
        raise ArtifactError(
            f"{ref}: the layer's bytes ({got} bytes, sha256:{h.hexdigest()[:16]}...) are not the ones its manifest "
            f"names ({size} bytes, {layer['digest'][:23]}...): a tampered or damaged artifact, refused"
        )


def _chunks(answer: Any, limit: int) -> Iterator[bytes]:
    left = limit
    while left > 0:
        chunk = answer.read(min(_CHUNK, left))
        if not chunk:
            return
        left -= len(chunk)
        yield chunk


def check_pulled(staged: str, notes: dict[str, str], secret: bytes | None, where: str) -> dict[str, Any]:
    """The bundle's own checks on the pulled file, and its index tag against the manifest's."""
    with BundleProgramCache(staged, secret=secret, check_owner=False) as bundle:
        damaged = bundle.damaged()
        if damaged:
            raise ArtifactError(f"{where}: {len(damaged)} entries of the bundle fail their check: refused")
        tag = bundle.index_tag.hex()
        if notes.get(A_INDEX_TAG) != tag:
            raise ArtifactError(
                f"{where}: the manifest names the index tag {notes.get(A_INDEX_TAG)!r}, the bundle has {tag}: "
                "the manifest does not describe this bundle, refused"
            )
        return {"entries": len(bundle), "signed": bundle.signed}


def pull(reference: str, out: str, *, secret: bytes | None = None, registry: Registry | None = None) -> dict[str, Any]:
    """Pull the bundle ``reference`` names into the file ``out`` (written only once checked).

    Staged beside ``out`` and renamed over it: ``out`` is the old file or the new whole one.
    As ``bundle create``, only an older bundle (or an empty file) at ``out`` is replaced."""
    ref = oci_reference(reference)
    target = os.path.abspath(out)
    fmt.refuse_other_file(target)
    reg = registry or Registry(ref.registry)
    raw, digest = fetch_manifest(reg, ref)
    layer, notes = bundle_layer(raw, str(ref))
    staged = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    try:
        download(reg, ref, layer, staged)
        summary = check_pulled(staged, notes, secret, str(ref))
        os.replace(staged, target)
    except BaseException:
        if os.path.lexists(staged):
            os.unlink(staged)
        raise
    archs = [a for a in notes.get(A_ARCHS, "").split(",") if a]
    return {
        "reference": str(ref),
        "path": target,
        "digest": digest,
        "layer": layer["digest"],
        "bytes": layer["size"],
        "archs": archs,
        **summary,
    }
