"""The ``kernelcache`` command: the demo and the tools to run a cache in production.

Bad input gives one clear line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from kernelcache import config
from kernelcache.cli import entries as ent
from kernelcache.cli.bundle import SECRET_ENV_OPTION, bundle, create_bundle, import_cmd, secret_from_env
from kernelcache.cli.common import (
    ALLOW_SHARED_OPTION,
    CACHE_DIR_OPTION,
    JSON_OPTION,
    Declined,
    Group,
    UserError,
)
from kernelcache.cli.common import emit as _emit
from kernelcache.cli.common import open_cache as _open
from kernelcache.cli.render import explain_text, ls_table, show_text, verify_text, warm_text
from kernelcache.integrations.materialized import KEEP_RECENT_S, remove_materialized
from kernelcache.stores.file.store import FileStreamProgramCache


@click.group(cls=Group)
@click.version_option(package_name="kernelcache")
@ALLOW_SHARED_OPTION  # before the command too: `kernelcache --allow-shared stats`
def main() -> None:
    """kernelcache: compile CUDA kernels once, reuse them everywhere."""
    config.check()  # a bad KERNELCACHE_* variable is one line before anything is opened


# -- demo ---------------------------------------------------------------------------------


def _choice(flag: str, choices: list[str], default: str, help: str) -> Any:
    """An option taking one of ``choices``, its default shown in --help."""
    return click.option(flag, type=click.Choice(choices), default=default, show_default=True, help=help)


@main.command()
@_choice(
    "--tile-size",
    ["8", "16", "32"],
    "16",
    "Edge of the square tile each thread block computes (part of the generated source).",
)
@_choice(
    "--epilogue",
    ["relu", "identity", "gelu"],
    "relu",
    "Function applied to A @ B + bias (part of the generated source).",
)
@click.option("--m", "m", type=click.IntRange(min=1), default=512, show_default=True, help="Rows of A and C.")
@click.option("--n", "n", type=click.IntRange(min=1), default=512, show_default=True, help="Columns of B and C.")
@click.option("--k", "k", type=click.IntRange(min=1), default=512, show_default=True, help="Columns of A, rows of B.")
@click.option("--device", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device ordinal to use.")
@click.option(
    "--warmup", type=click.IntRange(min=0), default=2, show_default=True, help="Untimed launches before timing."
)
@click.option(
    "--iterations", type=click.IntRange(min=1), default=10, show_default=True, help="Timed launches (mean is shown)."
)
@click.option(
    "--clear-cache", is_flag=True, help="Remove this kernel's entry first (the run is then a MISS); others stay."
)
@click.option(
    "--arch",
    default="sm_90",
    show_default=True,
    help="Target architecture when no GPU is present (sm_75 ... sm_121, as NVRTC supports).",
)
@CACHE_DIR_OPTION
@JSON_OPTION
def demo(
    tile_size: str,
    epilogue: str,
    m: int,
    n: int,
    k: int,
    device: int,
    warmup: int,
    iterations: int,
    clear_cache: bool,
    arch: str,
    cache_dir: str | None,
    as_json: bool,
) -> None:
    """Compile a generated matmul+bias+epilogue kernel once; later runs load it (HIT)."""
    from kernelcache.cli.demo import DemoConfig, check_arch, format_report, run_demo

    arch = check_arch(arch)
    cfg = DemoConfig(
        tile_size=int(tile_size),
        epilogue=epilogue,
        m=m,
        n=n,
        k=k,
        device=device,
        warmup=warmup,
        iterations=iterations,
        clear_cache=clear_cache,
        cache_dir=cache_dir,
        arch=arch,
    )
    report = run_demo(cfg)
    _emit(report, as_json, lambda r: click.echo(format_report(r)))
    if report["result"] == "FAILED":
        sys.exit(1)


# -- stats ---------------------------------------------------------------------------------


@main.command()
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
    """Hits, misses, hit rate, compiles, seconds saved, stores, evictions, errors, size.

    With --redis: also the counters of every host sharing that Redis namespace (the fleet;
    --by-host: per host). A tier that cannot be read is one line saying so; the command fails
    only when nothing could be read. With --zero: the counters shown are reset to 0.
    """
    from kernelcache.cli import stats as stats_mod

    if by_host and not (redis_url or config.redis_url()):
        raise click.UsageError("--by-host needs --redis URL (or KERNELCACHE_REDIS_URL)")
    per_store, notes = stats_mod.collect(
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
    _emit(data, as_json or fmt == "json", lambda d: stats_mod.render(per_store, zero, notes))


# -- ls / show / export ---------------------------------------------------------------------


@main.command(name="ls")
@CACHE_DIR_OPTION
@click.option(
    "--sort",
    type=click.Choice(["last-used", "created", "size", "compile-time"]),
    default="last-used",
    show_default=True,
    help="Order of the rows (largest or most recent first).",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most this many entries.")
@click.option("--object-store", "object_store", default=None, metavar="URL", help="List this bucket's entries instead.")
@JSON_OPTION
def ls_cmd(cache_dir: str | None, sort: str, limit: int | None, object_store: str | None, as_json: bool) -> None:
    """List entries: name prefix (show accepts it), types, arch, size, last used, compile time, kernels."""
    if object_store is not None:
        rows = ent.object_store_rows(object_store, sort, limit)
    else:
        rows = ent.list_rows(_open(cache_dir), sort, limit)
    _emit(rows, as_json, ls_table)


@main.command()
@click.argument("key_prefix")
@CACHE_DIR_OPTION
@JSON_OPTION
def show(key_prefix: str, cache_dir: str | None, as_json: bool) -> None:
    """The sidecar of one entry: toolchain, options, headers, compile log."""
    cache = _open(cache_dir)
    entry = _resolve(cache, key_prefix)
    record = ent.describe(entry)
    _emit(record, as_json, show_text)


@main.command()
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
    cache = _open(cache_dir)
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
    _emit(result, as_json, lambda r: click.echo(f"wrote {r['bytes']} bytes to {r['output']}"))


def _resolve(cache: FileStreamProgramCache, prefix: str) -> Any:
    try:
        return ent.find_by_prefix(cache, prefix)
    except LookupError as exc:
        raise UserError(str(exc)) from exc


# -- verify / prune / clear -------------------------------------------------------------------


@main.command()
@CACHE_DIR_OPTION
@click.option("--fix", is_flag=True, help="Remove corrupt entries, orphaned sidecars and stale temp files.")
@JSON_OPTION
def verify(cache_dir: str | None, fix: bool, as_json: bool) -> None:
    """Re-hash every entry; report corrupt entries, orphaned sidecars and stale temp files."""
    cache = _open(cache_dir, sweep=False, removes="verify --fix" if fix else None)
    report = ent.verify(cache, fix=fix, progress=not as_json)
    _emit(report, as_json, lambda data: verify_text(data, fix))
    if report["remaining"]:
        sys.exit(1)


@main.command()
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
    cache = _open(cache_dir, removes=None if dry_run else "prune")
    result = ent.prune(cache, size_cap, max_age, now=time.time(), dry_run=dry_run)
    if not dry_run:
        # Copies handed to Triton (kernelcache.integrations.materialized) are not entries: idle ones go too.
        result["materialized_removed"] = remove_materialized(cache.path, KEEP_RECENT_S)[0]
        result["old_layouts_removed"] = cache.remove_old_layouts()  # never read: only space
        result["lock_files_removed"] = cache.remove_idle_locks()  # each under its own lock

    def render(r: dict[str, Any]) -> None:
        verb, freed = ("would remove", "would free") if dry_run else ("removed", "freed")
        click.echo(
            f"{verb} {r['removed']} entries and {r['manifests_removed']} header manifests and source indexes, "
            f"{freed} {config.format_size(r['freed_bytes'])}"
        )

    _emit(result, as_json, render)


@main.command()
@CACHE_DIR_OPTION
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@JSON_OPTION
def clear(cache_dir: str | None, yes: bool, as_json: bool) -> None:
    """Remove every entry of the cache (the counters are kept: `stats --zero` resets them)."""
    cache = _open(cache_dir, removes="clear")
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
    copies = remove_materialized(cache.path)[0]  # the copies handed to Triton go with them
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

    _emit(result, as_json, render)


# -- warm / explain ---------------------------------------------------------------------------


@main.command()
@click.argument("manifest", type=click.Path(dir_okay=False))
@CACHE_DIR_OPTION
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default=True,
    help="Compiles at once (threads; NVRTC releases the GIL).",
)
@click.option(
    "--redis",
    "redis_url",
    default=None,
    metavar="URL",
    help="Also fill this Redis (default: KERNELCACHE_REDIS_URL; KERNELCACHE_REDIS_SECRET signs).",
)
@click.option(
    "--arch",
    "archs",
    multiple=True,
    metavar="ARCH",
    help="Compile every C++ kernel for this arch instead of its recorded one (repeatable; no GPU needed).",
)
@click.option("--bundle", "bundle_out", default=None, metavar="OUT", help="Then write the warmed cache as this bundle.")
@SECRET_ENV_OPTION
@JSON_OPTION
def warm(
    manifest: str,
    cache_dir: str | None,
    jobs: int,
    redis_url: str | None,
    archs: tuple[str, ...],
    bundle_out: str | None,
    secret_env: str | None,
    as_json: bool,
) -> None:
    """Precompile every kernel of a JSON/TOML manifest (or a KERNELCACHE_RECORD lockfile) in parallel.

    With --bundle OUT, the cache is then written as one bundle file (only when every kernel
    warmed; --secret-env VAR signs it); --json then prints {"kernels": [...], "bundle": {...}}.
    """
    from kernelcache.cli import warm as warm_mod
    from kernelcache.cli.demo import check_arch

    secret = secret_from_env(secret_env)
    items = warm_mod.load_manifest(manifest)
    if archs:
        items = warm_mod.for_archs(items, [check_arch(a) for a in archs])
    results = warm_mod.run(items, cache_dir, jobs, progress=not as_json, redis_url=redis_url)
    failed = any(r.get("error") for r in results)
    if bundle_out is not None:
        summary = None if failed else create_bundle(bundle_out, cache_dir, secret)
        _emit(
            {"kernels": results, "bundle": summary},
            as_json,
            lambda d: warm_text(d["kernels"], d["bundle"], bundle_asked=True),
        )
    else:
        _emit(results, as_json, warm_text)
    if failed:
        sys.exit(1)


@main.command()
@click.argument("first", type=click.Path(dir_okay=False))
@click.argument("second", type=click.Path(dir_okay=False), required=False)
@click.option("--entry", "entry_name", default=None, help="With one manifest: which entry (by name).")
@CACHE_DIR_OPTION
@JSON_OPTION
def explain(first: str, second: str | None, entry_name: str | None, cache_dir: str | None, as_json: bool) -> None:
    """Why did this miss? Compare two compile descriptions (or one with the cache)."""
    from kernelcache.cli import explain as explain_mod

    result = explain_mod.explain(first, second, entry_name, cache_dir)
    _emit(result, as_json, explain_text)


from kernelcache.cli.setup import config_group, init  # noqa: E402 - the commands of their own module

main.add_command(config_group)
main.add_command(init)
main.add_command(bundle)
main.add_command(import_cmd)


if __name__ == "__main__":  # pragma: no cover
    main()
