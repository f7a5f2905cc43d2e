"""The commands over one file store's entries: ``ls``, ``show``, ``export`` (reading) and
``verify``, ``prune``, ``clear`` (repairing and removing; each checks the cache-root marker)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from kernelcache import config
from kernelcache.cli import entries as ent
from kernelcache.cli.common import CACHE_DIR_OPTION, JSON_OPTION, Declined, UserError, emit, open_cache
from kernelcache.cli.render import ls_table, show_text, verify_text
from kernelcache.integrations.materialized import KEEP_RECENT_S, remove_materialized
from kernelcache.stores.file.store import FileStreamProgramCache


@click.command(name="ls")
@CACHE_DIR_OPTION
@click.option(
    "--sort",
    type=click.Choice(["last-used", "created", "size", "compile-time"]),
    default="last-used",
    show_default=True,
    help="Order of the rows (largest or most recent first).",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most this many entries.")
@click.option("--redis", "redis_url", default=None, metavar="URL", help="List this Redis namespace's kernels instead.")
@click.option("--redis-namespace", default="kernelcache", show_default=True, help="With --redis: the namespace.")
@click.option("--object-store", "object_store", default=None, metavar="URL", help="List this bucket's kernels instead.")
@JSON_OPTION
def ls_cmd(
    cache_dir: str | None,
    sort: str,
    limit: int | None,
    redis_url: str | None,
    redis_namespace: str,
    object_store: str | None,
    as_json: bool,
) -> None:
    """List entries: name prefix (show accepts it), types, arch, size, last used, compile time, kernels."""
    if redis_url is not None and object_store is not None:
        raise UserError("give one of --redis and --object-store")
    if redis_url is not None or object_store is not None:
        where, heads = ent.remote_heads(redis_url, object_store, redis_namespace)
        rows = ent.remote_rows(heads, where, sort, limit)
    else:
        rows = ent.list_rows(open_cache(cache_dir), sort, limit)
    emit(rows, as_json, ls_table)


@click.command()
@click.argument("key_prefix")
@CACHE_DIR_OPTION
@JSON_OPTION
def show(key_prefix: str, cache_dir: str | None, as_json: bool) -> None:
    """The sidecar of one entry: toolchain, options, headers, compile log."""
    cache = open_cache(cache_dir)
    entry = _resolve(cache, key_prefix)
    record = ent.describe(entry)
    emit(record, as_json, show_text)


@click.command()
@click.argument("key_prefix")
@click.option("-o", "--output", required=True, metavar="FILE", help="Where to write it; - for stdout.")
@CACHE_DIR_OPTION
@JSON_OPTION
def export(key_prefix: str, output: str, cache_dir: str | None, as_json: bool) -> None:
    """Write the raw artifact (cuobjdump / nvdisasm read it as it is)."""
    if output == "-" and as_json:
        raise UserError("-o - writes the artifact to stdout; --json would mix text into it: choose one")
    if output == "-" and sys.stdout.isatty():
        raise UserError("-o - would write binary into this terminal: redirect it (> file, | xxd) or give -o FILE")
    cache = open_cache(cache_dir)
    entry = _resolve(cache, key_prefix)
    data = ent.read_verified(entry)
    if data is None:
        raise UserError(f"entry {entry.name[:16]} is corrupt; run `kernelcache verify --fix`")
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    with open(output, "wb") as f:
        f.write(data)
    result = {"key": entry.name, "bytes": len(data), "output": output}
    emit(result, as_json, lambda r: click.echo(f"wrote {r['bytes']} bytes to {r['output']}"))


def _resolve(cache: FileStreamProgramCache, prefix: str) -> Any:
    try:
        return ent.find_by_prefix(cache, prefix)
    except LookupError as exc:
        raise UserError(str(exc)) from exc


@click.command()
@CACHE_DIR_OPTION
@click.option("--fix", is_flag=True, help="Remove corrupt entries, orphaned sidecars and stale temp files.")
@JSON_OPTION
def verify(cache_dir: str | None, fix: bool, as_json: bool) -> None:
    """Re-hash every entry; report corrupt entries, orphaned sidecars and stale temp files."""
    cache = open_cache(cache_dir, sweep=False, removes="verify --fix" if fix else None)
    report = ent.verify(cache, fix=fix, progress=not as_json)
    emit(report, as_json, lambda data: verify_text(data, fix))
    if report["remaining"]:
        sys.exit(1)


@click.command()
@CACHE_DIR_OPTION
@click.option(
    "--max-size", default=None, help="Evict least recently used entries down to this size (2GB; 0 or none: no cap)."
)
@click.option("--older-than", default=None, help="Remove entries not used for this long (e.g. 30d, 12h).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@JSON_OPTION
def prune(cache_dir: str | None, max_size: str | None, older_than: str | None, dry_run: bool, as_json: bool) -> None:
    """Remove entries (and header manifests) by age of last use, then by size (LRU first)."""
    if max_size is None and older_than is None:
        raise UserError("give --max-size SIZE and/or --older-than AGE (e.g. --max-size 2GB, --older-than 30d)")
    # One meaning of 0 for the cap everywhere (KERNELCACHE_MAX_SIZE=0, set max-size 0): no cap.
    size_cap = config.parse_cap(max_size) if max_size is not None else None
    max_age = ent.parse_age(older_than) if older_than is not None else None
    cache = open_cache(cache_dir, removes=None if dry_run else "prune")
    result = ent.prune(cache, size_cap, max_age, now=time.time(), dry_run=dry_run)
    if not dry_run:
        # Copies handed to Triton (kernelcache.integrations.materialized) are not entries: idle ones go too.
        copies, given = remove_materialized(cache.path, KEEP_RECENT_S)
        cache.copies_freed(given)  # they count under the cap (one budget): the tracker gives them back
        result["materialized_removed"] = copies
        result["old_layouts_removed"] = cache.remove_old_layouts()  # never read: only space
        result["lock_files_removed"] = cache.remove_idle_locks()  # each under its own lock

    def render(r: dict[str, Any]) -> None:
        verb, freed = ("would remove", "would free") if dry_run else ("removed", "freed")
        click.echo(
            f"{verb} {r['removed']} entries and {r['manifests_removed']} header manifests and source indexes, "
            f"{freed} {config.format_size(r['freed_bytes'])}"
        )

    emit(result, as_json, render)


@click.command()
@CACHE_DIR_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@JSON_OPTION
def clear(cache_dir: str | None, yes: bool, as_json: bool) -> None:
    """Remove every entry of the cache (the counters are kept: `stats --zero` resets them)."""
    cache = open_cache(cache_dir, removes="clear")
    try:
        confirmed = yes or click.confirm(f"Remove every entry in {cache.path}?", default=False)
    except click.Abort:  # no answer (stdin closed): the same as "no"
        confirmed = False
    if not confirmed:
        raise Declined("not confirmed; nothing removed (use --yes to skip the question)")
    entries = list(cache.iter_entries())
    count = sum(1 for e in entries if not ent.is_manifest(e))  # artifacts, as ls lists them
    manifests = len(entries) - count
    cache.clear()
    copies, given = remove_materialized(cache.path)  # the copies handed to Triton go with them
    cache.copies_freed(given)
    old = cache.remove_old_layouts()  # entries of earlier versions' layouts (never read)
    result = {"removed": count, "manifests_removed": manifests, "path": cache.path, "counters_reset": False}
    if copies:
        result["materialized_copies_removed"] = copies
    if old:
        result["old_layouts_removed"] = old

    def render(r: dict[str, Any]) -> None:
        extra = f" and {copies} materialized copies" if copies else ""
        extra += " and the tree of an earlier layout" if old else ""
        click.echo(
            f"removed {r['removed']} entries, {r['manifests_removed']} header manifests and source indexes{extra} "
            f"from {r['path']}; "
            "counters kept (`kernelcache stats --zero` resets them)"
        )

    emit(result, as_json, render)


COMMANDS = (ls_cmd, show, export, verify, prune, clear)
