"""The commands about compiling: ``demo``, ``warm`` (a manifest precompiled, optionally into a
bundle) and ``explain`` (why a miss). Each imports its logic when it runs: numpy, cuda.core
and rich are loaded only by the commands that use them."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from kernelcache.cli.bundle import SECRET_ENV_OPTION, create_bundle, secret_from_env
from kernelcache.cli.common import CACHE_DIR_OPTION, JSON_OPTION, emit
from kernelcache.cli.render import explain_text, warm_text


def _choice(flag: str, choices: list[str], default: str, help: str) -> Any:
    """An option taking one of ``choices``, its default shown in --help."""
    return click.option(flag, type=click.Choice(choices), default=default, show_default=True, help=help)


@click.command()
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
    emit(report, as_json, lambda r: click.echo(format_report(r)))
    if report["result"] == "FAILED":
        sys.exit(1)


@click.command()
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
@click.option(
    "--executor",
    "executor_spec",
    default=None,
    metavar="dask://HOST:PORT",
    help="Compile on this Dask cluster's workers (extra 'dask'); the results are stored here, as without it.",
)
@SECRET_ENV_OPTION
@JSON_OPTION
def warm(
    manifest: str,
    cache_dir: str | None,
    jobs: int,
    redis_url: str | None,
    archs: tuple[str, ...],
    bundle_out: str | None,
    executor_spec: str | None,
    secret_env: str | None,
    as_json: bool,
) -> None:
    """Precompile every kernel of a JSON/TOML manifest (or a KERNELCACHE_RECORD lockfile) in parallel.

    A kernel is ok once the cache holds it; one compiled but not stored fails with its
    reason, and warm then exits 1. A recorded request is compiled in its recorded working
    directory. With --bundle OUT, the cache is then written as one bundle file (only when
    every kernel warmed; --secret-env VAR signs it); --json then prints {"kernels": [...],
    "bundle": {...}}. KERNELCACHE_REQUIRE_HIT does not apply to warm's own compiles. With
    --executor dask://HOST:PORT each C++ compile is one task on that cluster (-j is then ignored).
    """
    from kernelcache.cli import warm as warm_mod

    with contextlib.ExitStack() as stack:
        executor = None
        if executor_spec is not None:  # a wrong value, a missing extra, no scheduler: said before anything runs
            from kernelcache.runners.remote import executor_for

            try:
                executor = stack.enter_context(executor_for(executor_spec))
            except ImportError as exc:
                raise click.ClickException(str(exc)) from None
        secret = secret_from_env(secret_env)
        kw = {"cache_dir": cache_dir, "redis_url": redis_url, "jobs": jobs, "progress": not as_json}
        results = warm_mod.warm(manifest, archs=archs, executor=executor, **kw)
    failed = any(r.get("error") for r in results)
    if bundle_out is not None:
        summary = None if failed else create_bundle(bundle_out, cache_dir, secret)
        if summary is not None and warm_mod.not_in_bundle(results, bundle_out, secret):
            os.unlink(bundle_out)  # never a bundle that lacks a kernel in silence
            summary, failed = None, True
        emit(
            {"kernels": results, "bundle": summary},
            as_json,
            lambda d: warm_text(d["kernels"], d["bundle"], bundle_asked=True),
        )
    else:
        emit(results, as_json, warm_text)
    if failed:
        sys.exit(1)


@click.command()
@click.argument("first", metavar="FIRST")
@click.argument("second", type=click.Path(dir_okay=False), required=False)
@click.option("--entry", "entry_name", default=None, help="With one manifest: which entry (by name).")
@CACHE_DIR_OPTION
@JSON_OPTION
def explain(first: str, second: str | None, entry_name: str | None, cache_dir: str | None, as_json: bool) -> None:
    """Why did this miss? Compare two compile descriptions, or one with the cache.

    FIRST is a manifest or lockfile (the call's arguments), or a key prefix as `ls`, the demo
    and a miss's reason print it. Exits 1 when the request is not in the cache.
    """
    from kernelcache.cli import explain as explain_mod

    result = explain_mod.explain(first, second, entry_name, cache_dir)
    emit(result, as_json, explain_text)
    if result["in_cache"] is False:
        sys.exit(1)


COMMANDS = (demo, warm, explain)
