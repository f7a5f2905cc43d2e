"""Warm manifests (``kernelcache warm``) and key explanations (``kernelcache explain``).

A manifest is JSON or TOML::

    [defaults]                      # optional; every kernel inherits these
    arch = ["sm_90"]
    target = "cubin"
    options = { std = "c++17" }

    [[kernel]]
    name = "saxpy"
    source = "kernels/saxpy.cu"     # relative to the manifest; or: code = "..." inline
    arch = ["sm_80", "sm_90"]       # a str or a list
    target = ["cubin", "ptx"]
    options = { use_fast_math = true }
    name_expressions = ["axpy<float>"]

JSON: ``{"defaults": {...}, "kernel": [{...}, ...]}`` (``kernels`` is accepted too).
Each kernel is compiled once per (arch, target).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

_KERNEL_FIELDS = {"name", "source", "code", "code_type", "arch", "target", "options", "name_expressions"}


@dataclass(frozen=True)
class WarmItem:
    name: str
    code: str
    code_type: str
    arch: str
    target_type: str
    options: dict[str, Any] = field(default_factory=dict)
    name_expressions: tuple[str, ...] = ()


def _read_document(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read manifest {path}: {exc.strerror or exc}") from exc
    try:
        if path.endswith(".toml"):
            if sys.version_info >= (3, 11):
                import tomllib
            else:  # pragma: no cover
                import tomli as tomllib
            return tomllib.loads(raw.decode())
        return json.loads(raw)
    except Exception as exc:
        raise ValueError(f"manifest {path} is not valid {'TOML' if path.endswith('.toml') else 'JSON'}: {exc}") from exc


def _as_list(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def load_manifest(path: str) -> list[WarmItem]:
    """Expand a manifest into one item per (kernel, arch, target); ValueError if malformed."""
    doc = _read_document(path)
    if not isinstance(doc, dict):
        raise ValueError(f"manifest {path}: the top level must be a table/object")
    defaults = doc.get("defaults", {})
    kernels = doc.get("kernel", doc.get("kernels"))
    if not isinstance(kernels, list) or not kernels:
        raise ValueError(f"manifest {path}: no kernels (expected a [[kernel]] list)")
    base = os.path.dirname(os.path.abspath(path))
    items = []
    for i, raw in enumerate(kernels):
        if not isinstance(raw, dict):
            raise ValueError(f"manifest {path}: kernel #{i + 1} is not a table")
        unknown = set(raw) - _KERNEL_FIELDS
        if unknown:
            raise ValueError(f"manifest {path}: kernel #{i + 1} has unknown field(s) {sorted(unknown)}")
        k = {**defaults, **raw, "options": {**defaults.get("options", {}), **raw.get("options", {})}}
        name = str(k.get("name") or f"kernel{i + 1}")
        if "code" in k:
            code = str(k["code"])
        elif "source" in k:
            src = os.path.join(base, str(k["source"]))
            try:
                with open(src, encoding="utf-8") as f:
                    code = f.read()
            except OSError as exc:
                raise ValueError(f"manifest {path}: kernel {name!r}: cannot read {src}: {exc.strerror}") from exc
        else:
            raise ValueError(f"manifest {path}: kernel {name!r} needs 'source' (a file) or 'code' (inline)")
        for arch in _as_list(k.get("arch", "sm_90")):
            for target in _as_list(k.get("target", "cubin")):
                items.append(
                    WarmItem(
                        name=name,
                        code=code,
                        code_type=str(k.get("code_type", "c++")),
                        arch=str(arch),
                        target_type=str(target),
                        options=dict(k["options"]),
                        name_expressions=tuple(k.get("name_expressions", ())),
                    )
                )
    return items


def _options(item: WarmItem) -> Any:
    from cuda.core import ProgramOptions

    try:
        return ProgramOptions(arch=item.arch, **item.options)
    except TypeError as exc:
        raise ValueError(f"kernel {item.name!r}: bad options {item.options}: {exc}") from exc


def warm_one(item: WarmItem, cache_dir: str | None) -> dict[str, Any]:
    """Compile one item through the cache (runs in a worker process)."""
    from kernelcache.compile import CompileInfo, compile_program
    from kernelcache.stores.filestream import FileStreamProgramCache

    result: dict[str, Any] = {"name": item.name, "arch": item.arch, "target_type": item.target_type}
    try:
        info = CompileInfo()
        compile_program(
            item.code,
            item.code_type,
            item.target_type,
            options=_options(item),
            cache=FileStreamProgramCache(cache_dir),
            name_expressions=item.name_expressions,
            info=info,
        )
        result.update(hit=info.hit, key=info.key_hex, seconds=info.seconds)
    except Exception as exc:
        result.update(
            hit=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        )
    return result


def run(items: list[WarmItem], cache_dir: str | None, jobs: int, progress: bool) -> list[dict[str, Any]]:
    """Warm every item with ``jobs`` worker processes; results in manifest order."""
    import multiprocessing as mp

    results: list[dict[str, Any] | None] = [None] * len(items)
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("warming", total=len(items))
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(items)), mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(warm_one, item, cache_dir): i for i, item in enumerate(items)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if bar is not None:
                    bar.advance(task)
    finally:
        if bar is not None:
            bar.stop()
    return [r for r in results if r is not None]


# -- explain ------------------------------------------------------------------------------


def _pick(items: list[WarmItem], entry_name: str | None, path: str) -> WarmItem:
    if entry_name is None:
        return items[0]
    for item in items:
        if item.name == entry_name:
            return item
    raise ValueError(f"manifest {path} has no kernel named {entry_name!r}")


def _explain_item(item: WarmItem) -> dict[str, str]:
    from kernelcache.keys import explain_program_cache_key

    return (
        explain_program_cache_key(
            code=item.code,
            code_type=item.code_type,
            options=_options(item),
            target_type=item.target_type,
            name_expressions=item.name_expressions,
            extra_digest=None,
        )
        if not _has_tracked(item)
        else _explain_tracked(item)
    )


def _has_tracked(item: WarmItem) -> bool:
    return any(item.options.get(f) for f in ("include_path", "pre_include"))


def _explain_tracked(item: WarmItem) -> dict[str, str]:
    # include_path/pre_include: explain the source+options part; headers are compared by
    # compile_program's manifest (the differing header shows as a cache miss below).
    from kernelcache.keys import explain_program_cache_key

    return explain_program_cache_key(
        code=item.code,
        code_type=item.code_type,
        options=_options(item),
        target_type=item.target_type,
        name_expressions=item.name_expressions,
        extra_digest=b"headers tracked by compile_program",
    )


def explain(first: str, second: str | None, entry_name: str | None, cache_dir: str | None) -> dict[str, Any]:
    """Which key components differ between two descriptions, or between one and the cache."""
    a_item = _pick(load_manifest(first), entry_name, first)
    a = _explain_item(a_item)
    if second is not None:
        b = _explain_item(_pick(load_manifest(second), entry_name, second))
        diffs = {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k) and k != "key"}
        return {"key": a["key"], "other_key": b["key"], "in_cache": None, "differences": diffs}
    from kernelcache.compile import probe
    from kernelcache.stores.filestream import FileStreamProgramCache

    cache = FileStreamProgramCache(cache_dir)
    found = probe(
        a_item.code,
        a_item.code_type,
        a_item.target_type,
        options=_options(a_item),
        cache=cache,
        name_expressions=a_item.name_expressions,
    )
    result: dict[str, Any] = {"key": found.key_hex or a["key"], "in_cache": found.hit, "differences": {}}
    if found.hit:
        return result
    # Not cached: compare with the cached entry of the same kernel(s) that differs least.
    ours = {f"options.{k}": v for k, v in _options_repr(a_item).items()}
    ours.update({k: v for k, v in a.items() if k.startswith("toolchain.") or k in ("code_type", "target_type")})
    best = None
    for entry in cache.iter_entries():
        meta = (entry.meta or {}).get("meta") or {}
        if not meta.get("kernels") or not set(meta["kernels"]) & {a_item.name, *a_item.name_expressions}:
            continue
        theirs = {f"options.{k}": v for k, v in (meta.get("options") or {}).items()}
        theirs.update({f"toolchain.{k}": v for k, v in (meta.get("toolchain") or {}).items()})
        theirs.update({"code_type": meta.get("code_type"), "target_type": meta.get("target_type")})
        diffs = {
            k: (theirs.get(k), ours.get(k)) for k in sorted(ours.keys() | theirs.keys()) if ours.get(k) != theirs.get(k)
        }
        if best is None or len(diffs) < len(best[1]):
            best = (entry.name, diffs)
    if best is not None:
        name, diffs = best
        result["closest"] = name[:16]
        result["differences"] = diffs or {"code or headers": ("cached", "changed")}
    return result


def _options_repr(item: WarmItem) -> dict[str, str]:
    opts = _options(item)
    return {k: repr(v) for k, v in getattr(opts, "__dict__", {}).items() if v is not None}
