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
from kernelcache.stores.record import Verdict

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


def _file_records(
    cache: FileStreamProgramCache, skipped: list[tuple[str, Verdict]]
) -> Iterator[tuple[str, bytes, Meta, Any]]:
    for entry in sorted(cache.iter_entries(), key=lambda e: e.name):
        data = ent.read_verified(entry)  # the sidecar passed its own check in iter_entries
        if data is None or entry.meta is None:
            skipped.append((entry.name, Verdict.DAMAGED))  # damaged, or rewritten while we read it
            continue
        yield entry.name, data, entry.meta.get("meta") or {}, entry.meta.get("created")


# A record the source holds but this process may not verify: signed, signed with another secret,
# or unsigned where a secret is set. Not damage: the right secret makes it readable.
_NEEDS_SECRET = (Verdict.NO_SECRET, Verdict.FOREIGN, Verdict.UNSIGNED)


class SourceNotVerified(click.ClickException):
    """bundle create would write fewer records than the source holds, for want of its secret: exit 1."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"kernelcache: error: {self.format_message()}", err=True)


def _counted(
    records: Iterator[tuple[str, bytes, Meta, Any]],
    tally: dict[str, int],
    skipped: list[tuple[str, Verdict]],
    source: str,
    secret_variable: str | None,
) -> Iterator[tuple[str, bytes, Meta, Any]]:
    """``records`` as they come, counted as kernels (as ``ls`` lists them) and records; at their
    end SourceNotVerified when some could not be verified for want of the source's secret.

    Raised inside write_bundle's loop: the staged file is removed and OUT stays as it was, so a
    good bundle is never replaced by an emptier one (signed records are not damaged ones)."""
    for item in records:
        tally["records"] += 1
        tally["kernels"] += ent.is_kernel(item[2])
        yield item
    locked = [verdict for _, verdict in skipped if verdict in _NEEDS_SECRET]
    if locked and secret_variable is not None:
        raise SourceNotVerified(
            f"{len(locked)} records of {source} are {locked[0].value}, so the bundle would hold "
            f"{tally['records']} of its {tally['records'] + len(skipped)} records: set {secret_variable} to the "
            "secret they were signed with (unset it for unsigned records); nothing was written"
        )


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
    written: ``kernels`` (as ``ls`` lists them), ``records`` (every record), ``skipped``
    (damaged: named). A shared store that cannot be read to the end: ConnectionError; records
    it holds that this process cannot verify (no secret, another one): SourceNotVerified.
    Either way nothing is written and OUT stays as it was."""
    start = time.perf_counter()
    skipped: list[tuple[str, Verdict]] = []
    # A Redis or object store that cannot be read to the end raises ConnectionError from
    # iter_records: the staged bundle is removed and OUT (an older bundle) is kept as it was.
    if redis_url is not None:
        records: Any = _redis(redis_url, read_only=True).iter_records(skipped)
        source, variable = f"Redis at {redis_url}", "KERNELCACHE_REDIS_SECRET"
    elif object_store is not None:
        records = _object_store(object_store, read_only=True).iter_records(skipped)
        source, variable = f"the object store {object_store}", "KERNELCACHE_OBJECT_STORE_SECRET"
    else:
        records = _file_records(_source(cache_dir), skipped)
        source, variable = "the cache directory", None
    tally = {"kernels": 0, "records": 0}
    summary = write_bundle(out, _counted(records, tally, skipped, source, variable), secret)
    return {
        "path": summary.path,
        "kernels": tally["kernels"],
        "records": summary.entries,
        "bytes": summary.bytes,
        "signed": summary.signed,
        "skipped": [name for name, _ in skipped],
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
        counts = f"{r['kernels']} kernels ({r['records']} records: with header manifests, source indexes, Triton files)"
        click.echo(f"wrote {r['path']}: {counts}, {r['bytes']} bytes, {signed}, in {r['seconds']} s")
        if r["skipped"]:
            left = len(r["skipped"])
            click.echo(f"left out {left} records that failed their check (damaged; see `kernelcache verify`)")

    emit(report, as_json, render)


@bundle.command(name="ls")
@click.argument("path", type=click.Path(dir_okay=False))
@SECRET_ENV_OPTION
@JSON_OPTION
def ls_cmd(path: str, secret_env: str | None, as_json: bool) -> None:
    """List the kernels of the bundle PATH (header manifests and other records are counted apart)."""
    with _open_bundle(path, secret_from_env(secret_env)) as store:
        rows = []
        for name, _length, head in store.heads():
            head = head or {}
            created = head.get("created")
            when = float(created) if isinstance(created, (int, float)) else 0.0  # a bundle has no last use
            info = EntryInfo(name, store.path, int(head.get("size") or 0), when, head)
            if ent.is_listed(info):
                rows.append(ent.entry_row(info))
        records = len(store)
        data = {"path": store.path, "signed": store.signed, "kernels": len(rows), "records": records}
    data["other_records"] = records - len(rows)
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
        target = _import_target(cache_dir)
    tally = {"kernels": 0, "records": 0, "already_there": 0, "dropped": 0}
    damaged = []
    with _open_bundle(path, secret_from_env(secret_env)) as store, target:
        for name in store.names():
            record = store.check_named(name)[1]
            if record is None:
                damaged.append(name)
                continue
            outcome = _import_one(target, name, record)
            tally[outcome] += 1
            tally["kernels"] += outcome == "records" and ent.is_kernel(record[1])
    report = {**tally, "damaged": damaged, "into": redis_url or object_store or target.path}

    def render(r: dict[str, Any]) -> None:
        line = f"imported {r['kernels']} kernels ({r['records']} records) into {r['into']}"
        if r["already_there"]:
            line += f"; {r['already_there']} records were already there"
        click.echo(line)
        if r["dropped"] or r["damaged"]:
            click.echo(f"not imported: {r['dropped']} refused by the store, {len(r['damaged'])} damaged in the bundle")

    emit(report, as_json, render)
    if damaged or tally["dropped"]:
        sys.exit(1)


def _import_target(cache_dir: str | None) -> FileStreamProgramCache:
    """The cache directory an import writes: a new or empty directory becomes a cache; one that
    holds anything else must prove it is a cache root (as clear requires), or nothing is written:
    an unmarked v2/ among a user's files would be refused by clear and prune for good."""
    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    if os.path.isdir(root) and os.listdir(root):
        require_cache_root(root, "import into")
    return open_cache(cache_dir, create=True)


def _import_one(target: Any, name: str, record: tuple[bytes, Meta]) -> str:
    """Copy one record into ``target``: "records" (written), "already_there" (an identical record
    is: a second import of one bundle writes nothing) or "dropped" (refused, warned)."""
    if target.read_named(name) == record:
        return "already_there"
    return "records" if target.write_named(name, record[0], record[1]) else "dropped"


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
