"""Warm manifests: what ``kernelcache warm`` (and ``explain``) read, each kernel as the request it stands for.

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

JSON: ``{"defaults": {...}, "kernel": [{...}, ...]}`` (``kernels`` is accepted too), or JSON
Lines: one such document per line, their kernels taken in order, repeated lines once (what
``KERNELCACHE_RECORD`` writes: compile/lockfile.py). A line cut short (its writer died
mid-line) is skipped with a warning; any other line that is not JSON is an error. Each
kernel is compiled once per (arch, target). In ``define_macro``, an inner ``["NAME",
"VALUE"]`` is one macro (cuda.core's tuple); ``code_type = "triton"`` with a ``triton_key``
names a Triton kernel a run looked up (listed, never compiled: Triton compiles its own).

A recorded request (a lockfile line, or any kernel with ``cwd``) is replayed as it was made
(compile/lockfile.py: one codec, both directions): its options exactly as written (paths
relative to its ``cwd``, not to the manifest), ``nvrtc_argv`` (CuPy's command line) as its
options, and the compile runs in ``cwd`` (relative to the manifest if relative). The requests are
warmed by cli/warm.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelcache.compile import lockfile

_KERNEL_FIELDS = {
    "name",
    "source",
    "code",
    "code_type",
    "arch",
    "target",
    "options",
    "name_expressions",
    "triton_key",
    "nvrtc_argv",
    "cwd",
}


@dataclass(frozen=True)
class WarmItem:
    name: str
    code: str
    code_type: str
    arch: str
    target_type: str
    options: dict[str, Any] = field(default_factory=dict)
    name_expressions: tuple[str, ...] = ()
    triton_key: str = ""  # code_type "triton": the kernel's Triton cache key (never compiled here)
    nvrtc_argv: tuple[str, ...] | None = None  # CuPy's NVRTC command line: the options, verbatim
    cwd: str | None = None  # where the request was made: the compile runs there ("": a deleted one)


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
        try:
            return json.loads(raw)
        except ValueError:
            lines = _json_lines(raw, path)
            if lines is None:
                raise
            return lines
    except Exception as exc:
        raise ValueError(f"manifest {path} is not valid {'TOML' if path.endswith('.toml') else 'JSON'}: {exc}") from exc


def _json_lines(raw: bytes, path: str) -> dict[str, Any] | None:
    """A JSON Lines manifest (one document per line) as one document; None if it is not one."""
    kernels: list[Any] = []
    seen: set[bytes] = set()
    torn = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip() or line in seen:
            continue
        seen.add(line)
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            if not _stops_short(exc):
                raise ValueError(
                    f"line {number}: {exc.msg} at column {exc.colno} (not a line cut short: fix or delete it)"
                ) from None
            torn.append(number)
            continue
        except ValueError:  # not UTF-8: no writer of ours left that
            raise ValueError(f"line {number} is not UTF-8 text") from None
        if not isinstance(doc, dict) or set(doc) != {"kernel"} or not isinstance(doc["kernel"], list):
            return None  # a line of something else: not a manifest of lines
        kernels.extend(doc["kernel"])
    if not kernels:
        return None
    if torn:
        print(f"manifest {path}: skipped line(s) {torn[:10]}: not whole JSON (its writer died?)", file=sys.stderr)
    return {"kernel": kernels}


def _stops_short(exc: json.JSONDecodeError) -> bool:
    """Whether a line that is not JSON is the start of a line (its writer died mid-line: the
    parse fails at the end, or in a string left open) rather than a line wrong where it stands
    (a hand edit), which would drop a kernel from the warm in silence if it were skipped."""
    return exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated string")


def _strings(value: Any, what: str) -> list[str]:
    """A str or a list of str, as a list; ValueError naming ``what`` otherwise."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"{what} must be a string or a list of strings, not {json.dumps(value)}")


def _kernel(raw: dict[str, Any], defaults: dict[str, Any], base: str, where: str) -> dict[str, Any]:
    """One kernel table merged over the defaults, every field checked for its type."""
    unknown = set(raw) - _KERNEL_FIELDS
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {sorted(unknown)}; known: {sorted(_KERNEL_FIELDS)}")
    for table, label in ((defaults, "defaults.options"), (raw, f"{where}: options")):
        if not isinstance(table.get("options", {}), dict):
            raise ValueError(f'{label} must be a table of ProgramOptions fields, e.g. {{ std = "c++17" }}')
    k = {**defaults, **raw, "options": {**defaults.get("options", {}), **raw.get("options", {})}}
    for field_name in ("name", "code", "source", "code_type"):
        if field_name in k and not isinstance(k[field_name], str):
            raise ValueError(f"{where}: {field_name} must be a string, not {json.dumps(k[field_name])}")
    out = {
        "arch": _strings(k.get("arch", "sm_90"), f"{where}: arch"),
        "target": _strings(k.get("target", "cubin"), f"{where}: target"),
        "name_expressions": tuple(_strings(k.get("name_expressions", []), f"{where}: name_expressions")),
        "options": dict(k["options"]),
    }
    if "nvrtc_argv" in k:
        argv = k["nvrtc_argv"]
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"{where}: nvrtc_argv must be a list of strings (NVRTC's flags), not {json.dumps(argv)}")
        out["nvrtc_argv"] = tuple(argv)
    if "cwd" in k:  # a recorded request: replayed as written, paths relative to its cwd
        if k["cwd"] is not None and not isinstance(k["cwd"], str):
            raise ValueError(f"{where}: cwd must be a string (a directory), not {json.dumps(k['cwd'])}")
        # null: recorded in a deleted directory ("": replayed in an empty one)
        out["cwd"] = "" if k["cwd"] is None else os.path.join(base, k["cwd"])
    elif "include_path" in out["options"]:
        # Paths in a manifest are relative to the manifest, like `source`, not to the cwd.
        dirs = _strings(out["options"]["include_path"], f"{where}: options.include_path")
        out["options"]["include_path"] = [os.path.join(base, d) for d in dirs]
    return {**k, **out}


def load_manifest(path: str) -> list[WarmItem]:
    """Expand a manifest into one item per (kernel, arch, target); ValueError if malformed."""
    doc = _read_document(path)
    if not isinstance(doc, dict):
        raise ValueError(f"manifest {path}: the top level must be a table/object")
    unknown = set(doc) - {"defaults", "kernel", "kernels"}
    if unknown:
        raise ValueError(
            f"manifest {path}: unknown top-level field(s) {sorted(unknown)}: put them under [defaults] or [[kernel]]"
        )
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise ValueError(f"manifest {path}: defaults must be a table, not {json.dumps(defaults)}")
    kernels = doc.get("kernel", doc.get("kernels"))
    if not isinstance(kernels, list) or not kernels:
        raise ValueError(f"manifest {path}: no kernels (expected a [[kernel]] list)")
    base = os.path.dirname(os.path.abspath(path))
    if defaults:
        _kernel({}, defaults, base, f"manifest {path}: defaults")  # its errors name the defaults
    items = []
    for i, raw in enumerate(kernels):
        if not isinstance(raw, dict):
            raise ValueError(f"manifest {path}: kernel #{i + 1} is not a table")
        k = _kernel(raw, defaults, base, f"manifest {path}: kernel #{i + 1}")
        name = k.get("name") or f"kernel{i + 1}"
        if k.get("code_type") == "triton":
            if not isinstance(k.get("triton_key"), str):
                raise ValueError(f"manifest {path}: kernel {name!r}: a Triton kernel needs its triton_key (a string)")
            items.append(WarmItem(name, "", "triton", "", "", triton_key=k["triton_key"]))
            continue
        if "code" in k:
            code = k["code"]
        elif "source" in k:
            src = os.path.join(base, k["source"])
            try:
                with open(src, encoding="utf-8") as f:
                    code = f.read()
            except OSError as exc:
                raise ValueError(f"manifest {path}: kernel {name!r}: cannot read {src}: {exc.strerror}") from exc
        else:
            raise ValueError(f"manifest {path}: kernel {name!r} needs 'source' (a file) or 'code' (inline)")
        for arch in k["arch"]:
            for target in k["target"]:
                items.append(
                    WarmItem(
                        name=name,
                        code=code,
                        code_type=k.get("code_type", "c++"),
                        arch=arch,
                        target_type=target,
                        options=dict(k["options"]),
                        name_expressions=k["name_expressions"],
                        nvrtc_argv=k.get("nvrtc_argv"),
                        cwd=k.get("cwd"),
                    )
                )
    return items


def for_archs(items: list[WarmItem], archs: Sequence[str]) -> list[WarmItem]:
    """Each C++ item once per arch of ``archs`` (its recorded arch replaced), repeats dropped.

    PTX and NVVM items keep their recorded arch (their text may name one target); Triton
    items stay as they are (listed, never compiled here).
    """
    out: dict[str, WarmItem] = {}
    for item in items:
        for arch in archs if item.code_type == "c++" else (item.arch,):
            new = dataclasses.replace(item, arch=arch)
            out.setdefault(json.dumps(dataclasses.asdict(new), sort_keys=True), new)
    return list(out.values())


def request_of(item: WarmItem) -> Any:
    """The item's CompileRequest (compile/lockfile's codec); ValueError naming the kernel if its
    options are bad."""
    table = {
        "code": item.code,
        "code_type": item.code_type,
        "target": item.target_type,
        "options": item.options,
        "name_expressions": item.name_expressions,
    }
    if item.nvrtc_argv is not None:
        table["nvrtc_argv"] = item.nvrtc_argv
    try:
        return lockfile.request_of(table, item.arch)
    except (TypeError, ValueError) as exc:
        shown = f"nvrtc_argv {list(item.nvrtc_argv)}" if item.nvrtc_argv is not None else f"options {item.options}"
        raise ValueError(f"kernel {item.name!r}: bad {shown}: {exc}") from exc


def program_options(item: WarmItem) -> Any:
    """The item's cuda.core ProgramOptions; ValueError naming the kernel if they are bad."""
    return request_of(item).options
