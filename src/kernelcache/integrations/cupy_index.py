"""A warm kernelcache.cupy hit without importing cuda.core: an index from CuPy's inputs to
the entry compile_program stored for them.

A fresh process's first CuPy hit through compile_program spends most of its time importing
cuda.core (its key needs ProgramOptions and cuda.core's identity) before it reads a single
file; CuPy's own cache only hashes and reads. So after compile_program has stored a compile,
kernelcache.cupy records, under a key of its own inputs, the key of that entry; the next
process reads the index record, then the entry (checked like every entry), and loads the
bytes into CuPy, without cuda.core.

Only for sources that cannot read a file (headers.scan.may_read_files is False: the text
names no include): their entry key is a function of the inputs alone, which the index key
covers (source, the NVRTC command line in order, target, name expressions, the NVRTC build
and the cuda.core/cuda.bindings versions, kernelcache's version and key schema). A source
with includes needs the header check of compile_program's full path on every hit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from kernelcache import __version__
from kernelcache.compile.metadata import read_artifact
from kernelcache.keys.derive import KEY_SCHEMA_VERSION, environment_bytes
from kernelcache.keys.toolchain import nvrtc_identity
from kernelcache.stores.safe import count, read_record, write_record

_DOMAIN = b"kernelcache.cupy.index/1\x00"
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)
_versions: str | None = None
# Settings under which every request must pass through compile_program (recorded, or
# required to hit with an explained miss): no short cut then.
_THROUGH_COMPILE_PROGRAM = ("KERNELCACHE_RECORD", "KERNELCACHE_REQUIRE_HIT")


def _package_versions() -> str:
    """cuda.core's and cuda.bindings' versions, read from the copies that would be imported,
    without importing them (what toolchain.cuda_core_identity pins, found the cheap way)."""
    global _versions
    if _versions is None:
        parts = []
        for module in ("cuda.core", "cuda.bindings"):
            try:
                spec = importlib.util.find_spec(module)
                folder = list(spec.submodule_search_locations or ())[0] if spec else ""
                with open(os.path.join(folder, "_version.py"), encoding="utf-8") as f:
                    found = _VERSION_LINE.search(f.read())
                parts.append(f"{module}=={found.group(1) if found else '?'}")
            except (OSError, IndexError, ImportError, ValueError) as exc:
                parts.append(f"{module}:{type(exc).__name__}")
        _versions = ";".join(parts)
    return _versions


def index_key(source: str, argv: Sequence[str], target: str, names: Sequence[str] | None) -> bytes:
    """The index record's key for one CuPy compile's inputs."""
    material = [
        __version__,
        KEY_SCHEMA_VERSION,
        nvrtc_identity(),
        environment_bytes().decode("utf-8", "surrogateescape"),  # what changes NVRTC's output, as keys say
        _package_versions(),
        source,
        list(argv),
        target,
        sorted(names) if names else None,
    ]
    return _DOMAIN + hashlib.sha256(json.dumps(material).encode("utf-8", "surrogatepass")).digest()


def usable() -> bool:
    """Whether a hit may skip compile_program: not when the cache is off or every compile
    must run again (KERNELCACHE_RECACHE), nor when every request must pass through
    compile_program to be recorded or explained."""
    from kernelcache import config

    if config.disabled() or config.recache():
        return False
    return not any(os.environ.get(v) for v in _THROUGH_COMPILE_PROGRAM)


def find(store: Any, key: bytes) -> tuple[bytes, bytes, dict[str, Any]] | None:
    """(entry key, payload, metadata) of the entry the index names, checked and counted as
    a hit; None on any miss."""
    found = read_record(store, key)
    if found is None:
        return None
    entry_key = bytes(found[0])
    record = read_artifact(store, entry_key)
    if record is None:
        return None
    payload, meta = record
    saved = float(meta.get("compile_seconds", 0.0))
    count(store, hits=1, bytes_read=len(payload), compile_us_saved=int(saved * 1e6))
    return entry_key, bytes(payload), meta


def remember(store: Any, key: bytes, entry_key: bytes) -> None:
    """Point the index at ``entry_key`` (the same bytes whoever writes it: a deterministic
    function of the inputs, so concurrent writers agree)."""
    meta = {"kind": "cupy-index", "code_type": "cupy", "target_type": "index", "kernels": []}
    write_record(store, key, entry_key, meta, internal=True)
