"""Bundles that ``KERNELCACHE_BUNDLES=oci://...`` names, pulled once into the user's cache directory.

::

    <cache dir>/oci/u<uid>/sha256-<hex>.kcb    a pulled bundle, named by its layer's digest (checked
                                               before it got that name: oci.py's checks, all of them)
    <cache dir>/oci/u<uid>/refs/<hash>.json   what a reference named last: manifest and layer digests
    <cache dir>/oci/u<uid>/sha256-<hex>.lock  held by the one process pulling that layer

The directory is each user's own (0700, and checked: owned by you, writable by nobody else),
in a team cache too: a bundle is code that gets run, and a pulled one is trusted because only
its user can have put it there. A pulled bundle is content-addressed: a second process (or
reference) naming the same layer finds it and downloads nothing. A digest reference it pulled
before costs no request at all; a tag costs one HEAD of its manifest, which says whether the tag
moved. When the registry cannot be reached, the bundle the reference named last is used, with
one warning. A reference that moves to another layer removes the old file once no reference
names it (a process that has it open keeps reading it: POSIX keeps an unlinked file's bytes).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import stat
import uuid
from collections.abc import Iterator
from typing import Any

from kernelcache.config.urls import OciReference, oci_reference
from kernelcache.log import WarnOnce
from kernelcache.stores.bundle import oci
from kernelcache.stores.bundle.registry import Registry
from kernelcache.stores.file.marker import holds_only_ours
from kernelcache.stores.file.treesafety import UnsafeCacheDirError, make_root, make_tree

_warned = WarnOnce()


def pulled_bundle(
    reference: str,
    root: str,
    *,
    secret: bytes | None = None,
    team: bool = False,
    registry: Registry | None = None,
) -> str:
    """The path of the checked local copy of the bundle ``reference`` names, pulled if needed.

    ``root``: the cache directory (``team``: a team cache). OSError (RegistryError) when it can
    be neither pulled nor found from an earlier pull; InvalidBundleError for an artifact refused."""
    ref = oci_reference(reference)
    home = pull_dir(root, team)
    known = _recall(home, ref)
    if known is not None and ref.digest is not None:
        return known["path"]  # a digest names one manifest forever: nothing to ask
    reg = registry or Registry(ref.registry)
    try:
        if known is not None and oci.resolve(reg, ref) == known["manifest"]:
            return known["path"]
        raw, digest = oci.fetch_manifest(reg, ref)
    except OSError as exc:
        if known is None:
            raise
        _warned.warn(
            f"stale:{ref}",
            f"cannot ask the registry about {ref} ({exc}); using the bundle it named last ({known['layer'][:23]}...)",
        )
        return known["path"]
    layer, notes = oci.bundle_layer(raw, str(ref))
    path = _layer_path(home, layer["digest"])
    if not os.path.exists(path):
        with _pull_lock(path):
            # Race: another process may have pulled it while this one waited on the lock.
            if not os.path.exists(path):
                _pull_into(reg, ref, layer, notes, path, secret)
    else:
        _same_index_tag(path, notes, str(ref))
    _remember(home, ref, digest, layer["digest"])
    return path


def pull_dir(root: str, team: bool) -> str:
    """``<root>/oci/u<uid>``: created where missing, checked (yours, nobody else can write it)."""
    real, team = make_root(root, team)  # team: only where the root is a team tree
    shared = os.path.join(real, "oci")
    # The root is marked a cache root as the file store marks it (when it holds only kernelcache's
    # files): a directory whose first user is a pull is then one clear and prune maintain.
    fresh = not os.path.lexists(shared) and holds_only_ours(real)
    make_tree(real, [shared], team, mark=fresh)
    home = os.path.join(shared, f"u{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(home, 0o700)
    st = os.lstat(home)  # never followed: a link planted there is refused, not entered
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDirError(
            f"kernelcache refuses {home} for pulled bundles: it is not a directory of yours that only you can "
            "write (a bundle pulled there is code your GPU will run); remove it"
        )
    os.makedirs(os.path.join(home, "refs"), mode=0o700, exist_ok=True)
    return home


def _layer_path(home: str, digest: str) -> str:
    return os.path.join(home, digest.replace(":", "-", 1) + ".kcb")


@contextlib.contextmanager
def _pull_lock(path: str) -> Iterator[None]:
    # Held while this layer downloads (single flight: the others wait, then find the file);
    # released by the kernel if the holder dies, so a waiter then pulls it itself.
    fd = os.open(path[: -len(".kcb")] + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pull_into(
    reg: Registry, ref: OciReference, layer: dict[str, Any], notes: dict[str, str], path: str, secret: bytes | None
) -> None:
    """Download, check, then rename into ``path``: a reader sees no file or the whole checked one."""
    stem = os.path.basename(path)
    for left in glob.glob(os.path.join(os.path.dirname(path), f".{stem}.*.tmp")):
        with contextlib.suppress(OSError):  # a dead puller's (only the lock's holder stages this layer)
            os.unlink(left)
    staged = os.path.join(os.path.dirname(path), f".{stem}.{uuid.uuid4().hex}.tmp")
    try:
        oci.download(reg, ref, layer, staged)
        oci.check_pulled(staged, notes, secret, str(ref))
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise


def _same_index_tag(path: str, notes: dict[str, str], where: str) -> None:
    """A layer pulled before, named by another manifest: that manifest must describe it too."""
    with open(path, "rb") as f:
        f.seek(-oci.fmt.TAG_SIZE, os.SEEK_END)
        tag = f.read(oci.fmt.TAG_SIZE).hex()
    if notes.get(oci.A_INDEX_TAG) != tag:
        raise oci.ArtifactError(f"{where}: the manifest names another index tag than its layer's bundle has: refused")


def _ref_file(home: str, ref: OciReference) -> str:
    return os.path.join(home, "refs", hashlib.sha256(str(ref).encode()).hexdigest()[:32] + ".json")


def _recall(home: str, ref: OciReference) -> dict[str, str] | None:
    """What ``ref`` named when it was last pulled, if that bundle is still here."""
    try:
        with open(_ref_file(home, ref), "rb") as f:
            known = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    if not isinstance(known, dict) or known.get("reference") != str(ref):
        return None
    layer, manifest = known.get("layer"), known.get("manifest")
    if not isinstance(layer, str) or not isinstance(manifest, str) or not layer.startswith("sha256:"):
        return None
    path = _layer_path(home, layer)
    return {"layer": layer, "manifest": manifest, "path": path} if os.path.exists(path) else None


def _remember(home: str, ref: OciReference, manifest: str, layer: str) -> None:
    target = _ref_file(home, ref)
    try:
        with open(target, "rb") as f:
            before = json.loads(f.read(1 << 16)).get("layer")
    except (OSError, ValueError, AttributeError):
        before = None
    staged = f"{target}.{uuid.uuid4().hex}.tmp"
    with open(staged, "w", encoding="utf-8") as f:
        json.dump({"reference": str(ref), "manifest": manifest, "layer": layer}, f)
    os.replace(staged, target)  # whole or not at all: a reader sees the old record or this one
    if isinstance(before, str) and before != layer:
        _forget(home, before)


def _forget(home: str, layer: str) -> None:
    """Remove the pulled bundle of ``layer`` once no reference names it.

    Race: a process resolving another reference to this layer right now may find it gone and
    pull it again: a download more, never a half file (it is only ever renamed into place). A
    process that read the old record of this same reference just before it changed may find
    the file gone when it opens it: that process goes without the bundle (one warning), never
    reads another file under its name. A process that has it open keeps reading it."""
    for name in glob.glob(os.path.join(home, "refs", "*.json")):
        try:
            with open(name, "rb") as f:
                if json.loads(f.read(1 << 16)).get("layer") == layer:
                    return
        except (OSError, ValueError, AttributeError):
            continue
    with contextlib.suppress(OSError):
        os.unlink(_layer_path(home, layer))
