"""``kernelcache stats``: the counters of a disk cache, of the fleet sharing a Redis namespace,
and what an object store holds. A tier that cannot be read is one line saying so; the others
are still shown, and the command fails only when nothing at all could be read."""

from __future__ import annotations

import os
import warnings
from typing import Any

import click

from kernelcache import config
from kernelcache.cli import entries as ent
from kernelcache.cli import table
from kernelcache.cli.common import CACHE_DIR_OPTION, JSON_OPTION, UserError, emit, open_cache
from kernelcache.stores.file import dircap

_ROWS = (
    "hits",
    "misses",
    "hit_rate",
    "compiles",
    "compile_seconds_saved",
    "stores",
    "evictions",
    "errors",
    "entries",
    "size",
    "max size",
)


def collect(
    cache_dir: str | None,
    redis_url: str | None,
    namespace: str,
    zero: bool,
    by_host: bool = False,
    object_store: str | None = None,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({"disk": ..., "redis": the fleet's counters, "object": ...}, notes on what could not be read).

    With ``zero`` the counters are then reset. UserError when no store could be read at all.
    """
    per_store: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    if os.path.isdir(root) or not (redis_url or object_store):
        per_store["disk"] = _disk(cache_dir, zero)
    else:
        notes.append(f"no cache directory at {root}: disk figures not shown")
    if redis_url:
        fleet, note = _redis_fleet(redis_url, namespace, by_host, zero)
        if fleet is not None:
            per_store["redis"] = fleet
        notes += [note] if note else []
    if object_store:
        held, note = _object_store(object_store)
        if held is not None:
            per_store["object"] = held
        notes += [note] if note else []
    if not per_store:
        raise UserError("; ".join(notes) or "nothing could be read")
    return per_store, notes


def _disk(cache_dir: str | None, zero: bool) -> dict[str, Any]:
    cache = open_cache(cache_dir)
    s: dict[str, Any] = dict(cache.stats())
    s["entries"] = sum(1 for e in cache.iter_entries() if ent.is_listed(e))  # as ls lists them
    s["max_size_bytes"] = cache.max_size_bytes  # None: no cap
    s["max_size_source"] = dircap.cap_for(cache.path)[1]
    s["path"] = cache.path
    if zero:
        cache.zero_stats()
    return s


def _redis_fleet(url: str, namespace: str, by_host: bool, zero: bool) -> tuple[dict[str, Any] | None, str]:
    """The fleet counters in Redis (and per host), or None and the line saying why not."""
    from kernelcache.stores.redis import listing as redis_listing
    from kernelcache.stores.redis.store import RedisProgramCache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the store's warning would repeat the note below
        with RedisProgramCache(url, namespace=namespace, read_only=True) as rc:
            fleet = rc.fleet_stats()
            written = rc.namespace_written() if fleet is not None else None
            hosts = rc.fleet_hosts() if fleet is not None and by_host else None
            if fleet is None or written is None:
                return None, f"Redis at {url} was not reached ({rc.last_error}): its figures are not shown"
            out: dict[str, Any] = dict(fleet)
            heads = redis_listing.heads(rc)  # kernels as ls lists them, records and bytes
            out.update(ent.remote_counts(heads) if heads is not None else {})
    out["url"], out["namespace"] = url, namespace
    if hosts is not None:
        out["hosts"] = hosts
    if zero:
        with RedisProgramCache(url, namespace=namespace) as writer:
            writer.zero_stats()
    if not written:
        return out, f"Redis namespace {namespace!r} at {url} has never been written (no counters, no entries)"
    return out, ""


def _object_store(url: str) -> tuple[dict[str, Any] | None, str]:
    try:
        _, heads = ent.remote_heads(object_store=url)
    except ValueError as exc:
        return None, f"{exc}: its figures are not shown"
    return {**ent.remote_counts(heads), "url": url}, ""


def render(data: dict[str, dict[str, Any]], zero: bool, notes: list[str]) -> None:
    """One table, a column per store, then where each store is, then what could not be read."""
    rows = []
    causes = sorted({c for store in data.values() for c in store.get("errors_by_cause") or {}})
    at = _ROWS.index("errors") + 1
    for row in (*_ROWS[:at], *(f"  {cause}" for cause in causes), *_ROWS[at:]):
        cells = []
        for store in data.values():
            if row.startswith("  "):  # an error cause, under the errors row
                by_cause = store.get("errors_by_cause")
                cells.append(str(by_cause.get(row.strip(), 0)) if by_cause is not None else "")
            elif row == "size":
                cells.append(config.format_size(store["size_bytes"]) if "size_bytes" in store else "")
            elif row == "max size":
                cells.append(config.format_size(store["max_size_bytes"]) if "path" in store else "")
            else:
                cells.append(_cell(row, store.get(row)))
        rows.append((row, *cells))
    # Plain text like ls (cli/table.py): rich's import and layout were a sixth of the command.
    click.echo(table.render("kernelcache stats", ("counter", *data), rows, right=range(1, len(data) + 1)))
    for name, store in data.items():
        if "path" in store:
            cap = config.format_size(store["max_size_bytes"])
            where = f"{store['path']} (max size {cap}: {store.get('max_size_source', 'default')})"
        elif name == "redis":
            where = f"{store.get('url')} namespace {store.get('namespace')} (every host's counts)"
        else:
            where = str(store.get("url"))
        click.echo(f"{name}: {where}")
    hosts = data.get("redis", {}).get("hosts")
    if hosts is not None:
        _render_hosts(hosts)
    for note in notes:
        click.echo(note)
    if zero:
        click.echo("counters zeroed (the figures above are from before; size and entries are kept)")


def _cell(row: str, value: Any) -> str:
    """One figure as the table shows it ("" where this store has no such figure: an object
    store counts no hits, say)."""
    if value is None:
        return ""
    if row == "hit_rate":
        return f"{value:.1%}"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _render_hosts(hosts: dict[str, dict[str, Any]]) -> None:
    fields = ("processes", "hits", "misses", "hit_rate", "compiles", "compile_seconds_saved", "stores", "errors")
    rows = []
    for field in fields:
        cells = []
        for counters in hosts.values():
            cells.append(_cell(field, counters.get(field, 0)))
        rows.append((field, *cells))
    title = "the fleet by host (hosts seen within a day; the totals keep every host)"
    click.echo(table.render(title, ("counter", *hosts), rows, right=range(1, len(hosts) + 1)))


@click.command()
@CACHE_DIR_OPTION
@click.option(
    "--redis",
    "redis_url",
    default=None,
    metavar="URL",
    help="Also report the fleet's counters kept in Redis at this URL (default: KERNELCACHE_REDIS_URL).",
)
@click.option("--redis-namespace", default="kernelcache", show_default=True, help="The Redis store's namespace.")
@click.option("--by-host", is_flag=True, help="With --redis: the fleet's counters per host too.")
@click.option(
    "--object-store",
    "object_store",
    default=None,
    metavar="URL",
    help="Also report what the object store at this URL holds (default: KERNELCACHE_OBJECT_STORE_URL).",
)
@click.option("--zero", is_flag=True, help="Show the counters, then reset them to 0 (size and entries stay).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "prometheus"]),
    default=None,
    help="text (default), json (= --json), or prometheus (the text exposition format, for a scraper).",
)
@JSON_OPTION
def stats(
    cache_dir: str | None,
    redis_url: str | None,
    redis_namespace: str,
    by_host: bool,
    object_store: str | None,
    zero: bool,
    fmt: str | None,
    as_json: bool,
) -> None:
    """Hits, misses, hit rate, compiles, seconds saved, stores, evictions, errors (by cause), size.

    With --redis: also the counters of every host sharing that Redis namespace (the fleet;
    --by-host: per host). A tier that cannot be read is one line saying so; the command fails
    only when nothing could be read. With --zero: the counters shown are reset to 0.
    """
    if by_host and not (redis_url or config.redis_url()):
        raise click.UsageError("--by-host needs --redis URL (or KERNELCACHE_REDIS_URL)")
    per_store, notes = collect(
        cache_dir,
        redis_url or config.redis_url(),
        redis_namespace,
        zero,
        by_host=by_host,
        object_store=object_store or config.object_store_url(),
    )
    if fmt == "prometheus":
        from kernelcache.cli import prometheus

        click.echo(prometheus.render(per_store), nl=False)
        for note in notes:
            click.echo(f"kernelcache: {note}", err=True)
        return
    data: dict[str, Any] = {**per_store, "zeroed": True} if zero and as_json else dict(per_store)
    if notes and (as_json or fmt == "json"):
        data["notes"] = notes
    emit(data, as_json or fmt == "json", lambda d: render(per_store, zero, notes))
