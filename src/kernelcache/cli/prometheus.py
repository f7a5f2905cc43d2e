"""``kernelcache stats --format prometheus``: the counters in Prometheus's text exposition format.

Every store kernelcache reports is one ``tier`` label value (``disk``, ``redis``: the fleet's
totals, ``object``); the fleet's per-host breakdown is a family of its own with a ``host``
label, so that summing a family never counts a host twice. Errors carry a ``cause`` label
(stats.ERROR_CAUSES, and ``other``), one sample per cause seen: summed by cause, they are
every error of the tier.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# (family, type, help, the stats field it reads)
_FAMILIES = (
    ("kernelcache_hits_total", "counter", "Look-ups that returned bytes.", "hits"),
    ("kernelcache_misses_total", "counter", "Look-ups that found nothing usable.", "misses"),
    ("kernelcache_compiles_total", "counter", "Compiler runs through compile_program.", "compiles"),
    ("kernelcache_compile_seconds_saved_total", "counter", "Compile seconds hits avoided.", "compile_seconds_saved"),
    ("kernelcache_stores_total", "counter", "Artifacts written.", "stores"),
    ("kernelcache_evictions_total", "counter", "Entries removed to honour the size cap.", "evictions"),
    ("kernelcache_errors_total", "counter", "Cache problems made a miss or a dropped write, by cause.", "errors"),
    ("kernelcache_size_bytes", "gauge", "Bytes the entries take.", "size_bytes"),
    ("kernelcache_max_size_bytes", "gauge", "The size cap in force (absent: no cap).", "max_size_bytes"),
    ("kernelcache_entries", "gauge", "Entries held (header manifests not included on disk).", "entries"),
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
    """One sample per error cause seen, labelled ``labels`` and the cause."""
    by_cause = counters.get("errors_by_cause") or {}
    return [(f'{labels},cause="{_label(cause)}"', n) for cause, n in sorted(by_cause.items())]


def _samples(data: dict[str, dict[str, Any]], field: str) -> list[tuple[str, Any]]:
    stores = [(f'tier="{_label(tier)}"', store) for tier, store in data.items() if isinstance(store, dict)]
    if field == "errors":
        return [sample for labels, store in stores for sample in _by_cause(labels, store)]
    return [(labels, store[field]) for labels, store in stores if isinstance(store.get(field), (int, float))]


def render(data: dict[str, dict[str, Any]]) -> str:
    """The text exposition of ``kernelcache stats``'s data (one block per family)."""
    lines: list[str] = []
    for name, kind, text, field in _FAMILIES:
        samples = _samples(data, field)
        if samples:
            lines += _family(name, kind, text, samples)
    hosts = sorted(((data.get("redis") or {}).get("hosts") or {}).items())
    for field in _HOST_FIELDS:
        kind = "gauge" if field == "processes" else "counter"
        name = f"kernelcache_fleet_host_{field}" + ("" if kind == "gauge" else "_total")
        if field == "errors":
            samples = [sample for host, counters in hosts for sample in _by_cause(f'host="{_label(host)}"', counters)]
        else:
            samples = [(f'host="{_label(host)}"', counters.get(field, 0)) for host, counters in hosts]
        if samples:
            lines += _family(name, kind, f"Fleet {field.replace('_', ' ')} by host (hosts seen within a day).", samples)
    return "\n".join(lines) + "\n"
