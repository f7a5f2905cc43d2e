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
from kernelcache.stats import public_view
from kernelcache.stores.file import dircap
from kernelcache.stores.file.counters import FileStats
from kernelcache.stores.file.marker import TIER_COUNTERS, tier_counters_path

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
    *,
    heads: bool = True,
    absent_is_empty: bool = False,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({tier: its figures}, notes on what could not be read).

    Each tier of this node is one key, its counts read from the cache directory (one place for
    every tier: stores.file.store.FileStreamProgramCache.tier_counters): "disk", and "memory",
    "bundle", "redis", "object" where the default cache has counted into them. "fleet": every
    host's counts in the Redis namespace and what it holds; "object" also what the bucket holds.
    Each figure set has "reachable" (1/0). ``heads``: count kernels by reading every record's
    head (``stats``), or only records from the listing (Prometheus, scraped again and again).
    ``absent_is_empty``: a cache directory not made yet reads as zeros. With ``zero`` the
    counters are then reset. UserError when no store could be read at all.
    """
    per_store: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    if absent_is_empty and not os.path.lexists(root):
        per_store["disk"] = {**public_view({}), "entries": 0, "max_size_bytes": dircap.cap_for(root)[0]}
        per_store["disk"].update(path=root, reachable=1)
    elif os.path.isdir(root) or not (redis_url or object_store):
        per_store["disk"] = _disk(cache_dir, zero)
        per_store.update(_tier_files(per_store["disk"]["path"], zero))
    else:
        notes.append(f"no cache directory at {root}: disk figures not shown")
    if config.bundles():
        per_store.setdefault("bundle", {})["reachable"] = int(_bundles_open(notes))
    if redis_url:
        fleet, note = _redis_fleet(redis_url, namespace, by_host, zero, heads)
        per_store.setdefault("redis", {})["reachable"] = int(fleet is not None)
        if fleet is not None:
            per_store["fleet"] = fleet
        notes += [note] if note else []
    if object_store:
        held, note = _object_store(object_store, heads)
        per_store.setdefault("object", {}).update(held or {"reachable": 0})
        notes += [note] if note else []
    if not any(store.get("reachable") for store in per_store.values() if store is not per_store.get("memory")):
        raise UserError("; ".join(notes) or "nothing could be read")
    return per_store, notes


def _disk(cache_dir: str | None, zero: bool) -> dict[str, Any]:
    cache = open_cache(cache_dir)
    s: dict[str, Any] = dict(cache.stats())
    s["entries"] = sum(1 for e in cache.iter_entries() if ent.is_listed(e))  # as ls lists them
    s["max_size_bytes"] = cache.max_size_bytes  # None: no cap
    s["max_size_source"] = dircap.cap_for(cache.path)[1]
    s["path"] = cache.path
    s["reachable"] = 1
    if zero:
        cache.zero_stats()
    return s


def _tier_files(root: str, zero: bool) -> dict[str, dict[str, Any]]:
    """This node's counts of each other tier of the default cache, from the files it counts into."""
    out = {}
    for tier in TIER_COUNTERS:
        path = tier_counters_path(root, tier)
        if not os.path.exists(path):
            continue
        counters = FileStats(path, create=False)
        out[tier] = {**public_view(counters.snapshot()), "counted_in": path}
        if tier == "memory":
            out[tier]["reachable"] = 1  # the other tiers are up when reached, below
        if zero:
            counters.zero()
        counters.close()
    return out


def _bundles_open(notes: list[str]) -> bool:
    """Whether every bundle of KERNELCACHE_BUNDLES opens (a line in ``notes`` for each that does not)."""
    from kernelcache.stores.bundle.store import BundleProgramCache

    ok = True
    for path in config.bundles():
        try:
            BundleProgramCache(path, secret=config.bundle_secret()).close()
        except (OSError, ValueError) as exc:
            ok = False
            notes.append(f"the bundle {path} (KERNELCACHE_BUNDLES) cannot be used: {exc}")
    return ok


def _redis_fleet(url: str, namespace: str, by_host: bool, zero: bool, heads: bool) -> tuple[dict[str, Any] | None, str]:
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
            if heads:  # kernels as ls lists them, records and bytes
                found = redis_listing.heads(rc)
                out.update(ent.remote_counts(found) if found is not None else {})
            else:
                out["records"] = len(rc)
    out["url"], out["namespace"], out["reachable"] = url, namespace, 1
    if hosts is not None:
        out["hosts"] = hosts
    if zero:
        with RedisProgramCache(url, namespace=namespace) as writer:
            writer.zero_stats()
    if not written:
        return out, f"Redis namespace {namespace!r} at {url} has never been written (no counters, no entries)"
    return out, ""


def _object_store(url: str, heads: bool) -> tuple[dict[str, Any] | None, str]:
    """What the bucket holds (kernels and records, or records alone without ``heads``)."""
    if heads:
        try:
            _, found = ent.remote_heads(object_store=url)
        except ValueError as exc:
            return None, f"{exc}: its figures are not shown"
        return {**ent.remote_counts(found), "url": url, "reachable": 1}, ""
    from kernelcache.stores.object import listing as object_listing
    from kernelcache.stores.object.store import ObjectStoreProgramCache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store = ObjectStoreProgramCache(url, read_only=True)
        rows = object_listing.rows(store)
    if rows is None:
        return None, f"the object store {url} was not reached ({store.last_error}): its figures are not shown"
    return {"records": len(rows), "size_bytes": sum(int(m["size"]) for m in rows), "url": url, "reachable": 1}, ""


def render(data: dict[str, dict[str, Any]], zero: bool, notes: list[str]) -> None:
    """One table, a column per tier with figures, then where each is, then what could not be read."""
    data = {name: store for name, store in data.items() if set(store) - {"reachable"}}
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
        click.echo(f"{name}: {_where(name, store)}")
    hosts = data.get("fleet", {}).get("hosts")
    if hosts is not None:
        _render_hosts(hosts)
    for note in notes:
        click.echo(note)
    if zero:
        click.echo("counters zeroed (the figures above are from before; size and entries are kept)")


def configured_tiers(per_store: dict[str, dict[str, Any]]) -> list[str]:
    """The tiers this node shows a scraper from the start (zeros until counted): the disk, the
    memory tier once the default cache is tiered, the bundles, Redis and the object store
    where configured, and any tier that has counted here before."""
    bundles = "bundle" in per_store
    tiered = bundles or "redis" in per_store or "object" in per_store
    wanted = {"disk": True, "memory": tiered, "bundle": bundles, "redis": False, "object": False}
    return [tier for tier, always in wanted.items() if always or tier in per_store]


def _where(name: str, store: dict[str, Any]) -> str:
    if "path" in store:
        cap = config.format_size(store["max_size_bytes"])
        return f"{store['path']} (max size {cap}: {store.get('max_size_source', 'default')})"
    if name == "fleet":
        return f"{store.get('url')} namespace {store.get('namespace')} (every host's counts, and what it holds)"
    counted = (
        f"this node's look-ups in its {name} tier, counted in {store['counted_in']}" if "counted_in" in store else ""
    )
    held = f"{store['url']} (what it holds)" if "url" in store else ""
    return "; ".join(part for part in (held, counted) if part)


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
    scrape = fmt == "prometheus"
    per_store, notes = collect(
        cache_dir,
        redis_url or config.redis_url(),
        redis_namespace,
        zero,
        by_host=by_host,
        object_store=object_store or config.object_store_url(),
        heads=not scrape,  # a scraper asks again and again: what a listing says, no record read
        absent_is_empty=scrape,  # a node with no cache yet is a node of zeros, not a failed scrape
    )
    if scrape:
        from kernelcache.cli import prometheus

        click.echo(prometheus.render(per_store, configured_tiers(per_store)), nl=False)
        for note in notes:
            click.echo(f"kernelcache: {note}", err=True)
        return
    data: dict[str, Any] = {**per_store, "zeroed": True} if zero and as_json else dict(per_store)
    if notes and (as_json or fmt == "json"):
        data["notes"] = notes
    emit(data, as_json or fmt == "json", lambda d: render(per_store, zero, notes))
