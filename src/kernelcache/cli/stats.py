"""``kernelcache stats``: the counters of a disk cache, and of the fleet sharing a Redis namespace."""

from __future__ import annotations

from typing import Any

import click

from kernelcache import config
from kernelcache.cli import entries as ent
from kernelcache.cli import table
from kernelcache.stores.file.store import FileStreamProgramCache

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


def collect(cache: FileStreamProgramCache, redis_url: str | None, namespace: str, zero: bool) -> dict[str, Any]:
    """{"disk": counters[, "redis": the fleet's counters]}; with ``zero`` the counters are then reset."""
    per_store: dict[str, dict[str, Any]] = {}
    s: dict[str, Any] = dict(cache.stats())
    s["entries"] = sum(1 for e in cache.iter_entries() if not ent.is_manifest(e))
    s["max_size_bytes"] = cache.max_size_bytes  # None: no cap
    s["path"] = cache.path
    per_store["disk"] = s
    if redis_url:
        per_store["redis"] = _redis_fleet(redis_url, namespace)
        if zero:
            from kernelcache.stores.redis.store import RedisProgramCache

            with RedisProgramCache(redis_url, namespace=namespace) as rc:
                rc.zero_stats()
    if zero:
        cache.zero_stats()
    return per_store


def render(data: dict[str, dict[str, Any]], zero: bool) -> None:
    """One table, a column per store, then where each store is."""
    rows = []
    for row in _ROWS:
        cells = []
        for store in data.values():
            if row == "size":
                cells.append(config.format_size(store["size_bytes"]) if "path" in store else "")
            elif row == "max size":
                cells.append(config.format_size(store["max_size_bytes"]) if "path" in store else "")
            else:
                v = store.get(row, "")
                cells.append(f"{v:.1%}" if row == "hit_rate" else f"{v:.3f}" if isinstance(v, float) else str(v))
        rows.append((row, *cells))
    # Plain text like ls (cli/table.py): rich's import and layout were a sixth of the command.
    click.echo(table.render("kernelcache stats", ("counter", *data), rows, right=range(1, len(data) + 1)))
    for name, store in data.items():
        where = store.get("path") or f"{store.get('url')} namespace {store.get('namespace')} (every host's counts)"
        click.echo(f"{name}: {where}")
    if zero:
        click.echo("counters zeroed (the figures above are from before; size and entries are kept)")


def _redis_fleet(url: str, namespace: str) -> dict[str, Any]:
    """The fleet counters in Redis; a Redis that cannot be reached is one clear error (ValueError)."""
    import warnings

    from kernelcache.stores.redis.store import RedisProgramCache

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the store's warning would repeat the error below
        with RedisProgramCache(url, namespace=namespace, read_only=True) as rc:
            fleet = rc.fleet_stats()
            if fleet is None:
                raise ValueError(f"cannot reach Redis at {url} ({rc.last_error})")
            out: dict[str, Any] = dict(fleet)
            out["entries"] = len(rc)  # Redis keys: artifacts and header manifests
    out["url"], out["namespace"] = url, namespace
    return out
