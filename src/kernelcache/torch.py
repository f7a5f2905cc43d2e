"""torch.compile's whole cache in one bundle: Inductor's Mega-Cache beside Triton's kernels.

PyTorch's Mega-Cache (``torch.compiler.save_cache_artifacts()`` / ``load_cache_artifacts()``)
carries Inductor's FX-graph, AOT-autograd and autotuning entries as one byte string; Triton's
kernels reach kernelcache's store through its cache manager (kernelcache.triton). ``save`` puts
the Mega-Cache bytes into the cache directory as a named blob (stores/bundle/blobs.py), so
``kernelcache bundle create`` carries both in one read-only file; on a new node ``load`` reads the
blob back from the bundles of KERNELCACHE_BUNDLES (a file, or ``oci://`` pulled once) and hands
it to torch, while Triton's kernels come from the same bundle: no Redis, no writable shared
directory (Inductor's and Triton's own directories stay local). Recipe (README)::

    # the warm node (CI): fill the cache, then one file of it
    TRITON_CACHE_MANAGER=kernelcache.triton:KernelCacheManager KERNELCACHE_DIR=build python warm.py
        # warm.py: torch.compile(model)(x); kernelcache.torch.save()
    kernelcache bundle create model.kcb --cache-dir build
    # each new node
    TRITON_CACHE_MANAGER=kernelcache.triton:KernelCacheManager KERNELCACHE_BUNDLES=/opt/model.kcb python serve.py
        # serve.py: kernelcache.torch.load() before the first torch.compile call

A blob is read only by the torch version that wrote it (Mega-Cache bytes are pickles of that
version's classes): another version's is left alone, with one warning. Nothing here ever fails
the caller's program: a blob that is missing, damaged or refused by torch is a warning and None.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

try:
    import torch
except ModuleNotFoundError as exc:  # pragma: no cover - exercised where torch is absent
    raise ModuleNotFoundError(
        "kernelcache.torch needs PyTorch: install it with `pip install 'kernelcache[torch]'`", name=exc.name
    ) from exc

from kernelcache import config
from kernelcache.log import WarnOnce
from kernelcache.stores.bundle import blobs
from kernelcache.stores.bundle.store import BundleProgramCache
from kernelcache.stores.file.store import FileStreamProgramCache

__all__ = ["MEGA_CACHE", "Loaded", "Saved", "load", "save"]

MEGA_CACHE = "torch/mega-cache"
MEDIA_TYPE = "application/vnd.kernelcache.torch-mega-cache.v1"
_TRITON_MANAGER = "kernelcache.triton:KernelCacheManager"
_warned = WarnOnce()


@dataclass(frozen=True)
class Saved:
    """What ``save`` stored: the blob's name, its size, the artifacts per kind, and where."""

    name: str
    bytes: int
    artifacts: dict[str, int]
    cache_dir: str


@dataclass(frozen=True)
class Loaded:
    """What ``load`` handed to torch, and from which bundle."""

    name: str
    bytes: int
    artifacts: dict[str, int]
    bundle: str
    triton_from_bundles: bool = field(default=False)  # Triton's manager is kernelcache's here


def _counts(info: object) -> dict[str, int]:
    """Artifacts per kind of a torch CacheInfo: its ``artifacts`` (kind -> keys), or in older
    versions one ``<kind>_artifacts`` list each."""
    found = getattr(info, "artifacts", None)
    if isinstance(found, dict):
        return {str(k): len(v) for k, v in found.items() if v}
    fields = {k.removesuffix("_artifacts"): v for k, v in vars(info).items()} if hasattr(info, "__dict__") else {}
    return {k: len(v) for k, v in fields.items() if isinstance(v, list) and v}


def save(name: str = MEGA_CACHE, *, cache_dir: str | os.PathLike[str] | None = None) -> Saved | None:
    """Store this process's Mega-Cache (``torch.compiler.save_cache_artifacts()``) as the blob
    ``name`` in the cache directory ``cache_dir`` (default KERNELCACHE_DIR), replacing an older one.

    Call it after the warm run (every ``torch.compile`` call done). None when torch recorded
    nothing, or when the store dropped the write (one warning)."""
    blobs.check_blob_name(name)
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    data, info = saved
    counts = _counts(info)
    root = os.fspath(cache_dir) if cache_dir is not None else config.cache_dir()
    meta = blobs.blob_meta(name, MEDIA_TYPE, {"torch": torch.__version__, "artifacts": counts})
    with FileStreamProgramCache(root, allow_shared=config.allow_shared()) as store:
        if not store.write_named(blobs.blob_entry_name(name), bytes(data), meta):
            return None
        return Saved(name, len(data), counts, store.path)


def load(
    name: str = MEGA_CACHE,
    *,
    bundles: Sequence[str | os.PathLike[str]] | None = None,
    secret: bytes | str | None = None,
) -> Loaded | None:
    """Hand the blob ``name`` of the first bundle holding it to ``torch.compiler.load_cache_artifacts``.

    ``bundles``: bundle files (``secret``: what they are signed with); default: the bundles of
    the default cache (KERNELCACHE_BUNDLES, KERNELCACHE_BUNDLE_SECRET; ``oci://`` ones pulled).
    Call it before the first ``torch.compile`` call. None when no bundle holds the blob, or it
    is another torch version's, or torch refuses it (one warning each)."""
    blobs.check_blob_name(name)
    for bundle, owned in _bundles(bundles, secret):
        try:
            found = blobs.blob_from_record(name, bundle.read_named(blobs.blob_entry_name(name)), bundle.path)
        finally:
            if owned:
                bundle.close()
        if found is not None:
            return _hand_to_torch(name, found, bundle.path)
    return None


def _bundles(
    paths: Sequence[str | os.PathLike[str]] | None, secret: bytes | str | None
) -> list[tuple[BundleProgramCache, bool]]:
    """(bundle, whether this call opened it) in order: those given, else the default cache's."""
    if paths is not None:
        return [(BundleProgramCache(p, secret=secret), True) for p in paths]
    from kernelcache.stores.default import default_cache_or_none
    from kernelcache.stores.tiered import leaf_tiers

    cache = default_cache_or_none()
    tiers = leaf_tiers(cache) if cache is not None else []
    return [(t, False) for t in tiers if isinstance(t, BundleProgramCache)]


def _hand_to_torch(name: str, found: tuple[bytes, dict[str, object]], where: str) -> Loaded | None:
    data, meta = found
    wrote = meta.get("torch")
    if wrote != torch.__version__:
        _warned.warn(
            f"version:{where}:{name}",
            f"{where}: the Mega-Cache blob {name!r} was saved by torch {wrote}, this is torch {torch.__version__}: "
            "not loaded (rebuild the bundle with this version)",
        )
        return None
    try:
        info = torch.compiler.load_cache_artifacts(data)
    except Exception as exc:  # torch's own unpickling and checks: never the caller's failure
        _warned.warn(f"refused:{where}:{name}", f"{where}: torch refused the Mega-Cache blob {name!r} ({exc!r})")
        return None
    manager = os.environ.get("TRITON_CACHE_MANAGER", "")
    return Loaded(name, len(data), _counts(info), where, triton_from_bundles=manager == _TRITON_MANAGER)
