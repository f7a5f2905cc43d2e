"""``kernelcache compile-server``: see and stop this user's compile servers (compile/server.py)."""

from __future__ import annotations

from typing import Any

import click

from kernelcache.cli.common import JSON_OPTION, emit


@click.group(name="compile-server", invoke_without_command=True)
@JSON_OPTION
@click.pass_context
def compile_server(ctx: click.Context, as_json: bool) -> None:
    """This user's compile servers: sockets, idle and handed-out workers.

    A process starts one when none runs for its environment: where the NVIDIA driver is (the
    default, KERNELCACHE_COMPILE_SERVER unset or auto), or anywhere with KERNELCACHE_COMPILE_SERVER=1."""
    if ctx.invoked_subcommand is None:
        emit(_servers(), as_json, _render)


@compile_server.command(name="stop")
def stop() -> None:
    """Stop every compile server of this user now, their idle workers with them.

    Workers already handed out stay with the processes that took them."""
    from kernelcache.compile import server_link

    stopped = [path for path, status in server_link.list_servers() if status and server_link.stop_server(path)]
    click.echo(f"stopped {len(stopped)} compile server{'s' * (len(stopped) != 1)}")


def _servers() -> list[dict[str, Any]]:
    from kernelcache.compile import server_link

    return [{"socket": path, **(status or {"answering": False})} for path, status in server_link.list_servers()]


def _render(rows: list[dict[str, Any]]) -> None:
    from kernelcache.cli import table
    from kernelcache.compile import server_link

    if not rows:
        click.echo(f"no compile server runs for this user (directory: {server_link.server_dir()})")
        return
    lines = []
    for r in rows:
        if r.get("answering") is False:
            lines.append((r["socket"], "-", "not answering", "", ""))
        else:
            workers = f"{r['idle']} idle, {r['starting']} starting"
            lines.append((r["socket"], str(r["pid"]), workers, str(r["given"]), r["broken"]))
    click.echo(table.render("compile servers", ("socket", "pid", "workers", "handed out", "problem"), lines))
