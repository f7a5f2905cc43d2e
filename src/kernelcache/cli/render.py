"""How a command's result reads for a person: the text form (``--json`` prints the data as it is)."""

from __future__ import annotations

from typing import Any

import click

from kernelcache.cli import entries as ent
from kernelcache.cli import table

_PREFIX = 12  # digits of an entry name that ls prints: unique in any real cache, short enough for 80 columns


def ls_table(data: list[dict[str, Any]]) -> None:
    """``ls``: one row per entry, as wide as the terminal ($COLUMNS; 80 in a pipe).

    Plain aligned text, not rich's Table: 2,000 rows must print in well under 0.3 s
    (cli/table.py says why). The key column is never shortened: `show` and `export` accept
    what it prints; only the kernel names fold, so 80 columns hold the rest.
    """
    rows = [
        (
            r["key"][:_PREFIX],
            r["code_type"],
            r["target_type"],
            r["arch"],
            str(r["size"]),
            ent.when(r["last_used"], short=True),
            "" if r["compile_seconds"] is None else f"{r['compile_seconds']:.3f}",
            ", ".join(r["kernels"]),  # folded at word boundaries to the terminal's width, never cut
        )
        for r in data
    ]
    heads = ("key", "code", "target", "arch", "size", "last used", "compile s", "kernels")  # created: in --json
    click.echo(table.render(f"kernelcache entries ({len(data)})", heads, rows, right=(4, 6), fold_last=14))


def show_text(data: dict[str, Any]) -> None:
    """``show``: the sidecar of one entry, field by field."""
    for field in ("key", "path", "size", "sha256", "created", "last_used"):
        click.echo(f"{field}: {data.get(field)}")
    meta = data.get("meta") or {}
    for field in ("code_type", "target_type", "name", "compile_seconds", "kernels"):
        click.echo(f"{field}: {_plain(meta.get(field))}")
    members = meta.get("members")
    if isinstance(members, dict):  # a Triton kernel's group: its files and their bytes
        click.echo("members:")
        for name, size in members.items():
            click.echo(f"  {name}  {_plain(size)} bytes")
    for section, sep in (("toolchain", ": "), ("options", " = ")):
        click.echo(f"{section}:")
        values = meta.get(section)
        for k, v in values.items() if isinstance(values, dict) else []:
            click.echo(f"  {k}{sep}{_plain(v)}")
    click.echo("headers:")
    headers = meta.get("headers")
    for h in headers if isinstance(headers, list) else []:
        click.echo(f"  {_plain(h)}")
    click.echo("log:")
    click.echo(meta.get("log") or "  (empty)")


def _plain(value: Any) -> str:
    """A metadata value as a person reads it: lists joined, None as a dash, no quotes."""
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    return "-" if value is None else str(value)


def verify_text(data: dict[str, Any], fix: bool) -> None:
    """``verify``: what was checked, found and (with --fix) fixed."""
    click.echo(f"checked {data['checked']} entries and {data['manifests_checked']} header manifests and source indexes")
    for kind in ("corrupt", "orphaned_sidecars", "stale_temps"):
        items = data[kind]
        click.echo(f"{kind.replace('_', ' ')}: {len(items)}")
        for item in items[:20]:
            click.echo(f"  {item}")
    if data.get("other_format"):
        click.echo(f"entries of another kernelcache version (kept, not judged): {len(data['other_format'])}")
    if fix:
        click.echo(f"fixed: {data['fixed']}")
    click.echo("OK" if data["remaining"] == 0 else f"{data['remaining']} problem(s) remain")


def explain_text(data: dict[str, Any]) -> None:
    """``explain``: in the cache or not, the changed headers and key components."""
    if data.get("in_cache") is not None:
        where = f" at {data['no_cache_at']}: no cache there" if data.get("no_cache_at") else ""
        if data.get("prefix") and data["key"] is None:
            click.echo(f"key {data['prefix']}: NOT in the cache{where}")
        elif data["key"] is None:  # a C++ miss: its key includes headers only a compile reveals
            click.echo(f"NOT in the cache (no stored header set of this source+options matches){where}")
        else:
            state = "in the cache" if data["in_cache"] else "NOT in the cache"
            state += f" ({data['unusable']})" if data.get("unusable") else ""
            click.echo(f"key {data['key'][:16]}: {state}")
        for name, value in (data.get("entry") or {}).items():
            click.echo(f"{name}: {value}")
        if data.get("note"):
            click.echo(data["note"])
        if data.get("closest"):
            click.echo(f"closest cached entry: {data['closest']}")
    for change, paths in (data.get("headers") or {}).items():
        for path in paths:
            click.echo(f"header {change}: {path}")
    if not data["differences"] and not any((data.get("headers") or {}).values()):
        click.echo("no differing key component")
    for name, (a, b) in data["differences"].items():
        click.echo(f"{name}:\n  - {a}\n  + {b}")


def warm_text(data: list[dict[str, Any]], bundle: dict[str, Any] | None = None, *, bundle_asked: bool = False) -> None:
    """``warm``: a line per kernel, the tally, and the bundle written when --bundle asked for one."""
    for r in data:
        status = "error: " + r["error"] if r.get("error") else ("hit" if r["hit"] else "compiled")
        status = "skipped: " + r["skipped"] if r.get("skipped") else status
        note = f" ({r['note']})" if r.get("note") else ""
        click.echo(f"{r['name']} [{r['arch']} {r['target_type']}]{note}: {status}")
    failed = sum(1 for r in data if r.get("error"))
    skipped = sum(1 for r in data if r.get("skipped"))
    click.echo(f"{len(data) - failed - skipped} ok, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    if bundle is not None:
        counts = f"{bundle['kernels']} kernels ({bundle['records']} records)"
        click.echo(f"bundle {bundle['path']}: {counts}, {bundle['bytes']} bytes")
    elif bundle_asked:
        click.echo("no bundle written: a kernel failed")
