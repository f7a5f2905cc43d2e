"""``kernelcache bundle create | ls | verify`` and ``kernelcache import``: a cache as one file and back."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import click

from kernelcache import config
from kernelcache.cli import entries as ent
from kernelcache.cli.common import CACHE_DIR_OPTION, JSON_OPTION, Group, UserError, emit, open_cache
from kernelcache.cli.render import ls_table
from kernelcache.stores.base import Meta
from kernelcache.stores.bundle.format import write_bundle
from kernelcache.stores.bundle.store import BundleProgramCache
from kernelcache.stores.file.marker import require_cache_root
from kernelcache.stores.file.store import EntryInfo, FileStreamProgramCache

SECRET_ENV_OPTION = click.option(
    "--secret-env",
    "secret_env",
    default=None,
    metavar="VAR",
    help="Name of the environment variable holding the secret that signs (or verifies) the bundle.",
)
REDIS_OPTION = click.option(
    "--redis", "redis_url", default=None, metavar="URL", help="A Redis namespace instead of a cache directory."
)


OBJECT_STORE_OPTION = click.option(
    "--object-store", "object_store", default=None, metavar="URL", help="An object store (s3://bucket/path...) instead."
)


def _object_store(url: str, read_only: bool) -> Any:
    from kernelcache.stores.object.store import ObjectStoreProgramCache

    return ObjectStoreProgramCache(url, secret=config.object_store_secret(), read_only=read_only)


def _one_place(cache_dir: str | None, redis_url: str | None, object_store: str | None) -> None:
    if sum(x is not None for x in (cache_dir, redis_url, object_store)) > 1:
        raise UserError("give one of --cache-dir, --redis and --object-store")


def secret_from_env(var: str | None) -> bytes | None:
    """The secret held by the environment variable ``var`` (None: no --secret-env)."""
    if var is None:
        return None
    value = os.environ.get(var)
    if not value:
        raise UserError(f"--secret-env {var}: the environment variable {var} is not set or empty")
    return value.encode()


def _redis(url: str, read_only: bool) -> Any:
    from kernelcache.stores.redis.store import RedisProgramCache

    return RedisProgramCache(url, secret=config.redis_secret(), read_only=read_only)


def _source(cache_dir: str | None) -> FileStreamProgramCache:
    """The cache a bundle is made of: it must prove it is a cache root (a directory that is not
    one is refused, nothing is written), and it is only read (no sweep of its tmp/)."""
    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    if os.path.isdir(root):
        require_cache_root(root, "make a bundle of")
    return open_cache(cache_dir, sweep=False)


def _file_records(cache: FileStreamProgramCache, skipped: list[str]) -> Iterator[tuple[str, bytes, Meta, Any]]:
    for entry in sorted(cache.iter_entries(), key=lambda e: e.name):
        data = ent.read_verified(entry)  # the sidecar passed its own check in iter_entries
        if data is None or entry.meta is None:
            skipped.append(entry.name)  # damaged, or rewritten while we read it
            continue
        yield entry.name, data, entry.meta.get("meta") or {}, entry.meta.get("created")


def create_bundle(
    out: str,
    cache_dir: str | None = None,
    secret: bytes | None = None,
    redis_url: str | None = None,
    object_store: str | None = None,
) -> dict[str, Any]:
    """Write every entry of the cache at ``cache_dir`` (or of the Redis at ``redis_url``, the
    object store at ``object_store``) that passes its check into the bundle ``out``: artifacts,
    header manifests, Triton groups and every other record, as they are. Returns what was
    written. A shared store that cannot be read to the end: ConnectionError, nothing written."""
    start = time.perf_counter()
    skipped: list[str] = []
    # A Redis or object store that cannot be read to the end raises ConnectionError from
    # iter_records: the staged bundle is removed and OUT (an older bundle) is kept as it was.
    if redis_url is not None:
        records: Any = _redis(redis_url, read_only=True).iter_records(skipped)
    elif object_store is not None:
        records = _object_store(object_store, read_only=True).iter_records(skipped)
    else:
        records = _file_records(_source(cache_dir), skipped)
    summary = write_bundle(out, records, secret)
    return {
        "path": summary.path,
        "entries": summary.entries,
        "bytes": summary.bytes,
        "signed": summary.signed,
        "skipped": skipped,
        "seconds": round(time.perf_counter() - start, 3),
    }


def _open_bundle(path: str, secret: bytes | None) -> BundleProgramCache:
    if not os.path.isfile(path):
        raise UserError(f"no bundle at {path}")
    return BundleProgramCache(path, secret=secret)


@click.group(cls=Group)
def bundle() -> None:
    """One read-only file holding every entry of a cache (ship it, mount it, KERNELCACHE_BUNDLES)."""


@bundle.command()
@click.argument("out", type=click.Path(dir_okay=False))
@CACHE_DIR_OPTION
@SECRET_ENV_OPTION
@REDIS_OPTION
@OBJECT_STORE_OPTION
@JSON_OPTION
def create(
    out: str,
    cache_dir: str | None,
    secret_env: str | None,
    redis_url: str | None,
    object_store: str | None,
    as_json: bool,
) -> None:
    """Write every entry of a cache directory (or a Redis namespace, an object store) into the bundle OUT."""
    _one_place(cache_dir, redis_url, object_store)
    report = create_bundle(out, cache_dir, secret_from_env(secret_env), redis_url, object_store)

    def render(r: dict[str, Any]) -> None:
        signed = "signed" if r["signed"] else "unsigned"
        click.echo(f"wrote {r['path']}: {r['entries']} entries, {r['bytes']} bytes, {signed}, in {r['seconds']} s")
        if r["skipped"]:
            click.echo(f"skipped {len(r['skipped'])} entries that failed their check (see `kernelcache verify`)")

    emit(report, as_json, render)


@bundle.command(name="ls")
@click.argument("path", type=click.Path(dir_okay=False))
@SECRET_ENV_OPTION
@JSON_OPTION
def ls_cmd(path: str, secret_env: str | None, as_json: bool) -> None:
    """List the entries of the bundle PATH (header manifests and other records are counted apart)."""
    with _open_bundle(path, secret_from_env(secret_env)) as store:
        rows, others = [], 0
        for name, _length, head in store.heads():
            head = head or {}
            created = head.get("created")
            when = float(created) if isinstance(created, (int, float)) else 0.0  # a bundle has no last use
            info = EntryInfo(name, store.path, int(head.get("size") or 0), when, head)
            if ent.is_manifest(info) or not isinstance(head.get("meta"), dict) or head["meta"].get("kind") == "blob":
                others += 1
                continue
            rows.append(ent.entry_row(info))
        data = {"path": store.path, "signed": store.signed, "entries": len(store), "other_records": others}
    data["rows"] = rows
    emit(data, as_json, lambda d: ls_table(d["rows"]))


@bundle.command()
@click.argument("path", type=click.Path(dir_okay=False))
@SECRET_ENV_OPTION
@JSON_OPTION
def verify(path: str, secret_env: str | None, as_json: bool) -> None:
    """Check every entry of the bundle PATH (with --secret-env: every signature); exit 1 on damage."""
    with _open_bundle(path, secret_from_env(secret_env)) as store:
        damaged = {name: why for name in store.names() if (why := _problem(store, name)) is not None}
        report = {"path": store.path, "checked": len(store), "signed": store.signed, "damaged": damaged}

    def render(r: dict[str, Any]) -> None:
        click.echo(f"checked {r['checked']} entries of {r['path']}: {len(r['damaged'])} damaged")
        for name, why in r["damaged"].items():
            click.echo(f"  {name}: {why}")

    emit(report, as_json, render)
    if damaged:
        sys.exit(1)


def _problem(store: BundleProgramCache, name: str) -> str | None:
    """Why the entry ``name`` (listed in the index) is not served, or None."""
    problem, found = store.check_named(name)
    if problem is None and found is None:  # listed, yet the look-up's binary search misses it
        return "not found by a look-up: the index is out of order (a miss every time)"
    return problem


@click.command(name="import")
@click.argument("path", type=click.Path(dir_okay=False))
@CACHE_DIR_OPTION
@REDIS_OPTION
@OBJECT_STORE_OPTION
@SECRET_ENV_OPTION
@JSON_OPTION
def import_cmd(
    path: str,
    cache_dir: str | None,
    redis_url: str | None,
    object_store: str | None,
    secret_env: str | None,
    as_json: bool,
) -> None:
    """Copy every entry of the bundle PATH into a cache directory, a Redis namespace or an object store."""
    _one_place(cache_dir, redis_url, object_store)
    target: Any
    if redis_url:
        target = _redis(redis_url, read_only=False)
    elif object_store:
        target = _object_store(object_store, read_only=False)
    else:
        target = open_cache(cache_dir, create=True)
    imported, dropped, damaged = 0, 0, []
    with _open_bundle(path, secret_from_env(secret_env)) as store, target:
        for name in store.names():
            record = store.check_named(name)[1]
            if record is None:
                damaged.append(name)
            elif target.write_named(name, record[0], record[1]):
                imported += 1
            else:
                dropped += 1
    report = {
        "imported": imported,
        "dropped": dropped,
        "damaged": damaged,
        "into": redis_url or object_store or target.path,
    }

    def render(r: dict[str, Any]) -> None:
        click.echo(f"imported {r['imported']} entries into {r['into']}")
        if r["dropped"] or r["damaged"]:
            click.echo(f"not imported: {r['dropped']} refused by the store, {len(r['damaged'])} damaged in the bundle")

    emit(report, as_json, render)
    if damaged or dropped:
        sys.exit(1)


# -- bundles as OCI artifacts (stores/bundle/oci.py) -------------------------------------------


@bundle.command(name="push")
@click.argument("path", type=click.Path(dir_okay=False))
@click.argument("reference", metavar="oci://REGISTRY/REPO:TAG")
@SECRET_ENV_OPTION
@JSON_OPTION
def push_cmd(path: str, reference: str, secret_env: str | None, as_json: bool) -> None:
    """Push the bundle PATH to a registry as one OCI artifact (checked first: a damaged one is not pushed)."""
    from kernelcache.stores.bundle.oci import push

    if not os.path.isfile(path):
        raise UserError(f"no bundle at {path}")
    report = push(path, reference, secret=secret_from_env(secret_env))

    def render(r: dict[str, Any]) -> None:
        archs = ", ".join(r["archs"]) or "no arch named"
        click.echo(f"pushed {path} to {r['reference']}: {r['entries']} entries, {r['bytes']} bytes ({archs})")
        click.echo(f"manifest {r['digest']}, layer {r['layer']}")

    emit(report, as_json, render)


@bundle.command(name="pull")
@click.argument("reference", metavar="oci://REGISTRY/REPO:TAG")
@click.argument("out", type=click.Path(dir_okay=False))
@SECRET_ENV_OPTION
@JSON_OPTION
def pull_cmd(reference: str, out: str, secret_env: str | None, as_json: bool) -> None:
    """Pull the bundle REFERENCE names into the file OUT, checked (digests, then every record) before it is written."""
    from kernelcache.stores.bundle.oci import pull

    report = pull(reference, out, secret=secret_from_env(secret_env))

    def render(r: dict[str, Any]) -> None:
        signed = "signed" if r["signed"] else "unsigned"
        click.echo(f"pulled {r['reference']} into {r['path']}: {r['entries']} entries, {r['bytes']} bytes, {signed}")

    emit(report, as_json, render)
