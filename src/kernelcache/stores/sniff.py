"""What a value written through the mapping API is, told from the value itself.

``store[key] = value`` (cuda.core's ``Program.compile(cache=...)`` writes that way) carries no
metadata of its own; the listing tools would show ``? ? ?``. The entry then records what the
bytes say: the kind (cubin, PTX, fatbin, LTO-IR from a cuda.core ObjectCode) and the arch.
Nothing here decides what runs: it is for people reading ``kernelcache ls``.
"""

from __future__ import annotations

import re
import struct
from typing import Any

_ELF = b"\x7fELF"
_FATBIN = b"\x50\xed\x55\xba"
_PTX_TARGET = rb"^\s*\.target\s+(sm_\w+|compute_\w+)"  # compiled on first use (re caches it), not at import
# EI_OSABI of a CUDA ELF: 0x41 keeps the SM number in bits 8-15 of e_flags, the older 0x33 in bits 0-7.
_CUDA_ABIS = {0x41: 8, 0x33: 0}


def describe(value: Any, data: bytes) -> dict[str, Any]:
    """Metadata for a mapping write: who wrote it (``cuda.core`` for an ObjectCode, else
    ``bytes``), the target type and the arch where the bytes tell them."""
    from_cuda_core = type(value).__module__.startswith("cuda.core")
    meta: dict[str, Any] = {"code_type": "cuda.core" if from_cuda_core else "bytes"}
    kind, arch = _kind_and_arch(data)
    if from_cuda_core:  # an ObjectCode names its own kind (cubin, ptx, ltoir)
        kind = str(getattr(value, "code_type", "") or "") or kind
    if kind:
        meta["target_type"] = kind
    if arch:
        meta["arch"] = arch
    return meta


def _kind_and_arch(data: bytes) -> tuple[str, str]:
    if data.startswith(_ELF) and len(data) >= 52:
        shift = _CUDA_ABIS.get(data[7])
        if shift is None:
            return "elf", ""
        (flags,) = struct.unpack_from("<I", data, 48)
        return "cubin", f"sm_{(flags >> shift) & 0xFF}"
    if data.startswith(_FATBIN):
        return "fatbin", ""
    head = data[:4096]
    if b".version" in head:
        m = re.search(_PTX_TARGET, head, re.M)
        return "ptx", m.group(1).decode() if m else ""
    return "", ""
