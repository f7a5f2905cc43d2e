"""``kernelcache config`` (every setting in force and where it came from; ``set max-size`` in a
cache directory) and ``kernelcache init --team`` (a team cache tree made the right way)."""

from __future__ import annotations

import grp
import os
from typing import Any

import click

from kernelcache import config
from kernelcache.cli.common import CACHE_DIR_OPTION, JSON_OPTION, UserError, emit, open_cache
from kernelcache.config import file as configfile
from kernelcache.stores.file import dircap

_SECRETS = (
    "KERNELCACHE_REDIS_SECRET",
    "KERNELCACHE_OBJECT_STORE_SECRET",
    "KERNELCACHE_BUNDLE_SECRET",
    "KERNELCACHE_OCI_PASSWORD",
    "KERNELCACHE_OCI_TOKEN",
)


def settings(cache_dir: str | None) -> list[dict[str, str]]:
    """One row per setting: its name, the variable, the value in force, and where it came from."""
    root = os.path.abspath(cache_dir) if cache_dir is not None else config.cache_dir()
    rows = []
    for name, label, default in config.VARIABLES:
        raw = os.environ.get(name, "")
        source = configfile.source(name) if raw else "default"
        value = ("(set)" if name in _SECRETS else raw) if raw else default
        if name == "KERNELCACHE_DIR":
            value, source = root, "--cache-dir" if cache_dir is not None else source
        elif name == "KERNELCACHE_MAX_SIZE":
            cap, source = dircap.cap_for(root)
            value = config.format_size(cap)
        elif name == "KERNELCACHE_CONFIG":
            value = raw or configfile.default_path()
            in_use = configfile.file_in_use()
            value += "" if in_use else " (not found)" if not os.path.isfile(value) else " (empty)"
        rows.append({"setting": label, "variable": name, "value": value, "source": source})
    return rows + toolchain_rows()


def toolchain_rows() -> list[dict[str, str]]:
    """The compiler library files that compile here and their identities (what keys record, from
    keys.toolchain: the one answer workers and keys use), and the node's compile slots."""
    from kernelcache.keys import toolchain
    from kernelcache.runners import slots

    rows = []
    for lib in toolchain.LIBRARIES:
        try:
            path, how = toolchain.library_file(lib) or toolchain.library_file(lib, load=True) or ("", "")
            value = f"{path} ({toolchain.library_identity(lib)})"
        except Exception as exc:  # none here: what a key records for it then
            value, how = f"none ({toolchain.library_identity(lib)}: {exc})", "not found"
        rows.append({"setting": f"{lib} library", "variable": "", "value": value, "source": how})
    where = slots.waiting_path()
    shown = f"{slots.usable_cores()} in {os.path.dirname(where)}" if where else "not kept (see the warning)"
    rows.append({"setting": "compile slots", "variable": "", "value": shown, "source": "usable CPUs (affinity, quota)"})
    return rows


def _render(rows: list[dict[str, str]]) -> None:
    from kernelcache.cli import table

    lines = [(r["setting"], r["value"], r["source"]) for r in rows]
    click.echo(table.render("kernelcache config", ("setting", "value", "from"), lines))


@click.group(name="config", invoke_without_command=True)
@CACHE_DIR_OPTION
@JSON_OPTION
@click.pass_context
def config_group(ctx: click.Context, cache_dir: str | None, as_json: bool) -> None:
    """Every setting in force and where each came from (environment, config file, cache directory).

    `kernelcache config --cache-dir DIR set max-size 20G` stores a cap in that cache directory:
    every process opening it uses it unless it sets one (max_size_bytes=, KERNELCACHE_MAX_SIZE).
    """
    ctx.obj = {"cache_dir": os.path.expanduser(cache_dir) if cache_dir is not None else None}
    if ctx.invoked_subcommand is None:
        emit(settings(ctx.obj["cache_dir"]), as_json, _render)


@config_group.command(name="set")
@click.argument("key", type=click.Choice(["max-size"]))
@click.argument("value")
@click.pass_context
def config_set(ctx: click.Context, key: str, value: str) -> None:
    """Store KEY (max-size: a size like 20G, or none) in the cache directory."""
    cache = open_cache(ctx.obj["cache_dir"])
    try:
        cap = dircap.write(cache.path, value, shared=config.allow_shared())
    except ValueError as exc:
        raise UserError(f"max-size {value!r}: {exc}") from None
    click.echo(f"max size of {cache.path}: {config.format_size(cap)} (stored in {dircap.path_of(cache.path)})")
    if os.environ.get("KERNELCACHE_MAX_SIZE", "").strip():
        click.echo("note: KERNELCACHE_MAX_SIZE is set here, and wins over it in this environment")


@click.command()
@click.option("--team", "group", required=True, metavar="GROUP", help="The group whose members share the cache.")
@click.argument("directory", type=click.Path(file_okay=False))
@JSON_OPTION
def init(group: str, directory: str, as_json: bool) -> None:
    """Create a team cache tree owned by GROUP (setgid, group-writable): run it as root.

    Every directory of the tree is made here, so no member owns one: a member who leaves
    the group does not lock the others out. Open it with --allow-shared (KERNELCACHE_ALLOW_SHARED=1).
    """
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise UserError(f"no group named {group!r} (create it first, e.g. groupadd {group})") from None
    made = _make_team_tree(os.path.abspath(os.path.expanduser(directory)), gid)
    emit(made, as_json, _render_init)


def _make_team_tree(root: str, gid: int) -> dict[str, Any]:
    from kernelcache.stores.file.marker import FORMAT_DIR
    from kernelcache.stores.file.treesafety import TEAM_DIR_MODE, make_tree

    os.makedirs(root, exist_ok=True)
    if os.listdir(root) and not os.path.isdir(os.path.join(root, FORMAT_DIR)):
        raise UserError(f"{root} is not empty and holds no kernelcache tree: give a new or empty directory")
    os.chown(root, -1, gid)
    os.chmod(root, TEAM_DIR_MODE)
    base = os.path.join(root, FORMAT_DIR)
    entries = os.path.join(base, "entries")
    # Every shard too: a shard made later by its first writer would be that member's, and
    # refused to the others once that member leaves the group.
    shards = [os.path.join(entries, f"{i:02x}") for i in range(256)]
    subdirs = [base, entries, os.path.join(base, "tmp"), os.path.join(base, "locks"), *shards]
    make_tree(root, subdirs, team=True, mark=True)
    return {"path": root, "gid": gid, "owner_uid": os.stat(root).st_uid, "directories": 1 + len(subdirs)}


def _render_init(made: dict[str, Any]) -> None:
    click.echo(f"team cache at {made['path']}: group {made['gid']}, {made['directories']} directories (2770, setgid)")
    if made["owner_uid"] != 0:
        click.echo(
            "note: not run as root, so the tree is yours: if you leave the group, the others are locked "
            "out; run it as root (sudo) to avoid that"
        )
    click.echo(f"use it with: KERNELCACHE_DIR={made['path']} KERNELCACHE_ALLOW_SHARED=1")
