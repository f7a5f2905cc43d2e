"""The Triton kernel the CPU-only test children compile for sm_90 (no GPU needed), in one place.

Imported lazily by those children (tests/support/_triton_disk_child.py, _triton_worker.py and the CPU mode of
_integration_gpu_child.py), so that their modes that never compile need no Triton.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "a": "fp32", "n": "i32", "BLOCK": "constexpr"}


@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, a * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def listen() -> list[bool]:
    """Triton's compile events from now on, in order: True for a cache hit, False for a compile."""
    from triton import knobs

    events: list[bool] = []
    knobs.compilation.listener = lambda **kw: events.append(bool(kw["cache_hit"]))
    return events


def compile_sm90(block: int) -> Any:
    """``axpy`` with BLOCK=``block`` compiled by triton.compile for sm_90 (the CompiledKernel)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=axpy, signature=SIGNATURE, constexprs={"BLOCK": block})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32))
