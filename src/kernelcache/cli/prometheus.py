"""``kernelcache stats --format prometheus``: the counters in Prometheus's text exposition format.

Made to be summed over a fleet of nodes, each scraped on its own:

- ``kernelcache_*{tier="..."}``: this node's counts, one ``tier`` label value per tier of its
  default cache (``disk``, ``memory``, ``bundle``, ``redis``, ``object``): the look-ups this
  node made in its Redis tier, never the fleet's totals. Summed over nodes they are the fleet.
- ``kernelcache_fleet_*``: what the shared tiers hold and count for every host (the totals kept
  in Redis; the records a namespace or a bucket holds), under names of their own: every node
  exports the same values, so take one node's (``max``), never their sum. The per-host
  breakdown is ``kernelcache_fleet_host_*{host="..."}``.
- ``kernelcache_tier_up{tier="..."}``: 1 when the tier was read or reached, 0 when not.

Every series is there from the first scrape, zeros included (a counter that appears only with
its first event breaks rate() and alerts on absence): each tier the node has, every error
cause (stats.ERROR_CAUSES, and ``other``). Summed by cause, errors are every error of a tier.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kernelcache.stats import ERROR_CAUSES, OTHER_CAUSE

_CAUSES = (*ERROR_CAUSES, OTHER_CAUSE)
# (family, type, help, the stats field it reads) of each tier of this node
_FAMILIES = (
    ("kernelcache_hits_total", "counter", "Look-ups that returned bytes.", "hits"),
    ("kernelcache_misses_total", "counter", "Look-ups that found nothing usable.", "misses"),
    ("kernelcache_compiles_total", "counter", "Compiler runs through compile_program.", "compiles"),
    ("kernelcache_compile_seconds_saved_total", "counter", "Compile seconds hits avoided.", "compile_seconds_saved"),
    ("kernelcache_stores_total", "counter", "Artifacts written.", "stores"),
    ("kernelcache_evictions_total", "counter", "Entries removed to honour the size cap.", "evictions"),
    ("kernelcache_errors_total", "counter", "Cache problems made a miss or a dropped write, by cause.", "errors"),
)
# Of the disk tier only: what this node's cache directory holds.
_DISK_GAUGES = (
    ("kernelcache_size_bytes", "Bytes the entries take (and the copies handed to Triton).", "size_bytes"),
    ("kernelcache_max_size_bytes", "The size cap in force (absent: no cap).", "max_size_bytes"),
    ("kernelcache_entries", "Kernels held, as kernelcache ls lists them.", "entries"),
)
_FLEET = (
    ("kernelcache_fleet_hits_total", "counter", "Every host's look-ups that returned bytes.", "hits"),
    ("kernelcache_fleet_misses_total", "counter", "Every host's look-ups that found nothing.", "misses"),
    ("kernelcache_fleet_stores_total", "counter", "Artifacts every host wrote.", "stores"),
    ("kernelcache_fleet_compiles_total", "counter", "Every host's compiler runs.", "compiles"),
    (
        "kernelcache_fleet_compile_seconds_saved_total",
        "counter",
        "Compile seconds the fleet's hits avoided.",
        "compile_seconds_saved",
    ),
    ("kernelcache_fleet_errors_total", "counter", "Every host's cache problems, by cause.", "errors"),
)
_HOST_FIELDS = ("hits", "misses", "stores", "compiles", "compile_seconds_saved", "errors", "processes")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: Any) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _family(name: str, kind: str, text: str, samples: Iterable[tuple[str, Any]]) -> list[str]:
    lines = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
    # A counter's samples carry the family name with _total (text format 0.0.4).
    lines += [f"{name}{{{labels}}} {_number(value)}" for labels, value in samples]
    return lines


def _by_cause(labels: str, counters: dict[str, Any]) -> list[tuple[str, Any]]:
    """One sample per error cause, zeros too, labelled ``labels`` and the cause."""
    by_cause = counters.get("errors_by_cause") or {}
    return [(f'{labels},cause="{_label(cause)}"', by_cause.get(cause, 0)) for cause in _CAUSES]


def _node(data: dict[str, dict[str, Any]], tiers: list[str]) -> list[str]:
    lines: list[str] = []
    for name, kind, text, field in _FAMILIES:
        samples: list[tuple[str, Any]] = []
        for tier in tiers:
            counters, labels = data.get(tier) or {}, f'tier="{_label(tier)}"'
            if field == "errors":
                samples += _by_cause(labels, counters)
            else:
                samples.append((labels, counters.get(field, 0)))
        lines += _family(name, kind, text, samples)
    disk = data.get("disk") or {}
    for name, text, field in _DISK_GAUGES:
        if isinstance(disk.get(field), (int, float)):
            lines += _family(name, "gauge", text, [('tier="disk"', disk[field])])
    up = [
        (f'tier="{_label(tier)}"', (data.get(tier) or {})["reachable"])
        for tier in tiers
        if "reachable" in (data.get(tier) or {})
    ]
    lines += _family("kernelcache_tier_up", "gauge", "1: the tier was read or reached by this scrape; 0: not.", up)
    return lines


def _fleet(data: dict[str, dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    fleet = data.get("fleet")
    if fleet is not None:
        labels = f'namespace="{_label(str(fleet.get("namespace", "")))}"'
        for name, kind, text, field in _FLEET:
            samples = _by_cause(labels, fleet) if field == "errors" else [(labels, fleet.get(field, 0))]
            lines += _family(name, kind, text, samples)
    held = [(tier, data[tier]) for tier in ("fleet", "object") if "records" in (data.get(tier) or {})]
    if held:
        tier_of = {"fleet": "redis", "object": "object"}
        text = "Records a shared tier holds (kernels, header manifests, source indexes, Triton files)."
        lines += _family(
            "kernelcache_fleet_records", "gauge", text, [(f'tier="{tier_of[t]}"', s["records"]) for t, s in held]
        )
        sized = [(f'tier="{tier_of[t]}"', s["size_bytes"]) for t, s in held if "size_bytes" in s]
        if sized:
            lines += _family("kernelcache_fleet_size_bytes", "gauge", "Bytes a shared tier's records take.", sized)
    hosts = sorted(((fleet or {}).get("hosts") or {}).items())
    for field in _HOST_FIELDS if hosts else ():
        kind = "gauge" if field == "processes" else "counter"
        name = f"kernelcache_fleet_host_{field}" + ("" if kind == "gauge" else "_total")
        if field == "errors":
            samples = [sample for host, counters in hosts for sample in _by_cause(f'host="{_label(host)}"', counters)]
        else:
            samples = [(f'host="{_label(host)}"', counters.get(field, 0)) for host, counters in hosts]
        lines += _family(name, kind, f"Fleet {field.replace('_', ' ')} by host (hosts seen within a day).", samples)
    return lines


def render(data: dict[str, dict[str, Any]], tiers: list[str]) -> str:
    """The text exposition of ``kernelcache stats``'s data: this node's ``tiers`` (every one of them
    from the start), then the fleet's figures, then each tier's reachability."""
    return "\n".join([*_node(data, tiers), *_fleet(data)]) + "\n"
