"""Warm manifests: what ``kernelcache warm`` (and ``explain``) read, and the warming itself.

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
from dataclasses import dataclass, field
from typing import Any

from kernelcache.headers import as_list

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
        for arch in as_list(k.get("arch", "sm_90")):
            for target in as_list(k.get("target", "cubin")):
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


def program_options(item: WarmItem) -> Any:
    """The item's cuda.core ProgramOptions; ValueError naming the kernel if they are bad."""
    from cuda.core import ProgramOptions

    try:
        return ProgramOptions(arch=item.arch, **item.options)
    except TypeError as exc:
        raise ValueError(f"kernel {item.name!r}: bad options {item.options}: {exc}") from exc


def run(items: list[WarmItem], cache_dir: str | None, jobs: int, progress: bool) -> list[dict[str, Any]]:
    """Warm every item through compile_many on ``jobs`` threads; results in manifest order.

    The hits are looked up first, in this thread: a manifest that is all hits starts no
    thread at all, so ``-j 8`` costs what ``-j 1`` does there. A failing item is reported
    as its own error; the others are compiled and stored all the same.
    """
    from kernelcache.batch import run_batch
    from kernelcache.stores.filestream import FileStreamProgramCache

    results: list[dict[str, Any]] = [
        {"name": item.name, "arch": item.arch, "target_type": item.target_type} for item in items
    ]
    requests: list[dict[str, Any]] = []
    for item, result in zip(items, results):
        try:
            options = program_options(item)
        except ValueError as exc:
            options, result["error"] = None, _first_line(exc)
        requests.append(
            {
                "code": item.code,
                "code_type": item.code_type,
                "target_type": item.target_type,
                "options": options,
                "name_expressions": item.name_expressions,
            }
        )
    todo = [i for i, r in enumerate(results) if "error" not in r]
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("warming", total=len(todo))
    try:
        batch = run_batch(
            [requests[i] for i in todo],
            FileStreamProgramCache(cache_dir),
            jobs,
            what="warm",
            strict=False,
            on_done=(lambda _i: bar.advance(task)) if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.stop()
    for j, i in enumerate(todo):
        info = batch.infos[j]
        if j in batch.errors:
            results[i].update(hit=False, error=_first_line(batch.errors[j]))
        elif info is not None:
            results[i].update(hit=info.hit, key=info.entry_name, seconds=info.seconds)
    for r in results:
        r.setdefault("hit", False)
    return results


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
