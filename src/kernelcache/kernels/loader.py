"""Loading a compiled module on a device: whose context, and what the driver's errors mean.

Kept apart from KernelCache (kernels.cache) because both rules are about the driver, not
about caching: a load happens in the requested device's primary context and leaves the
calling thread's current context as it found it; and a driver error is read for what it
says about a cached entry -- bad bytes (heal), a wrong kernel name (the caller's
mistake), or this machine's driver or GPU (keep the entry, it is good for others).
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kernelcache.compile.metadata import kernel_names

if TYPE_CHECKING:
    from cuda.core import Kernel, ObjectCode

__all__ = ["bad_bytes", "device_options", "driver_error", "heals", "kernel_of", "no_such_kernel", "on_device"]

# What a driver error on loading a cached artifact says about the entry:
# - the bytes are not a loadable image (damaged, or written wrong by a peer): evict the
#   entry and recompile once -- a corrupt shared cache heals itself;
# - CUDA_ERROR_NOT_FOUND: the program has no kernel of that name -- the caller's mistake,
#   raised at once as a ValueError;
# - CUDA_ERROR_NO_BINARY_FOR_GPU: bad bytes when the options target this very GPU (the key
#   says so, the image does not); when they target another GPU, the caller's choice;
# - anything else (CUDA_ERROR_UNSUPPORTED_PTX_VERSION, _JIT_COMPILER_NOT_FOUND, out of
#   memory...) depends on this machine's driver or GPU, not on the entry: raised as it is,
#   and the shared entry, good for its other users, is kept.
_BAD_BYTES = frozenset({"CUDA_ERROR_INVALID_IMAGE", "CUDA_ERROR_INVALID_PTX", "CUDA_ERROR_INVALID_SOURCE"})
_DRIVER_ERROR = re.compile(r"CUDA_ERROR_[A-Z0-9_]+")


def driver_error(exc: BaseException) -> str | None:
    """The CUDA_ERROR_* name an exception carries, if any."""
    found = _DRIVER_ERROR.search(f"{type(exc).__name__} {exc}")
    return found.group(0) if found else None


def bad_bytes(exc: BaseException, options: Any, compute_capability: tuple[int, int]) -> bool:
    """Whether a load error on a GPU of ``compute_capability`` means the artifact's bytes are bad."""
    code = driver_error(exc)
    if code in _BAD_BYTES:
        return True
    if code != "CUDA_ERROR_NO_BINARY_FOR_GPU":
        return False
    major, minor = compute_capability
    arch = getattr(options, "arch", None) or ""
    return re.fullmatch(rf"sm_{major}{minor}[af]?", str(arch)) is not None


def heals(exc: BaseException, *, hit: bool, options: Any, compute_capability: tuple[int, int]) -> bool:
    """Whether a load error is healed (the entry evicted, compiled again, loaded once more):
    only for bytes that came from the cache (a hit) and are bad. A fresh compile the driver
    refuses is not the cache's doing: compiling again would give the same bytes."""
    return hit and bad_bytes(exc, options, compute_capability)


def no_such_kernel(exc: BaseException, name: str, code: str | bytes, symbol_mapping: Any) -> ValueError | None:
    """The ValueError to raise when a load error says the program has no kernel ``name``
    (the caller's mistake: nothing is evicted); None for any other error."""
    if driver_error(exc) != "CUDA_ERROR_NOT_FOUND":
        return None
    known = ", ".join(kernel_names(code, symbol_mapping)) or "none found in the source"
    return ValueError(
        f"kernelcache: the program has no kernel named {name!r} (its kernels: {known}); for a "
        "template or another C++ name, pass it in name_expressions and ask for that same text"
    )


def kernel_of(obj: ObjectCode, name: str, code: str | bytes) -> Kernel:
    """``obj.get_kernel(name)``; a name the program does not have is a ValueError saying so."""
    try:
        return obj.get_kernel(name)
    except Exception as exc:
        mistake = no_such_kernel(exc, name, code, getattr(obj, "symbol_mapping", None))
        if mistake is None:
            raise
        raise mistake from exc


_primary_lock = threading.Lock()
_primary: dict[int, Any] = {}


def _primary_context(device_id: int) -> Any:
    """The device's primary context, retained once per process (as cuda.core's set_current does)."""
    from cuda.bindings import driver

    ctx = _primary.get(device_id)
    if ctx is None:
        with _primary_lock:
            ctx = _primary.get(device_id)
            if ctx is None:
                ctx = _checked(driver.cuDevicePrimaryCtxRetain(driver.CUdevice(device_id)), "cuDevicePrimaryCtxRetain")
                _primary[device_id] = ctx
    return ctx


def _checked(result: tuple[Any, ...], what: str) -> Any:
    from cuda.bindings import driver

    if result[0] != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"kernelcache: {what} failed: {result[0]!r}")
    return result[1] if len(result) > 1 else None


@contextlib.contextmanager
def on_device(device_id: int) -> Iterator[None]:
    """Make the device's primary context current for the block, then give the calling thread
    back exactly the context it had (another device's, a context of its own, or none):
    loading a kernel must not move the caller's later allocations and launches to another GPU."""
    from cuda.bindings import driver

    before = _checked(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    ctx = _primary_context(device_id)
    if int(before) == int(ctx):
        yield
        return
    _checked(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    try:
        yield
    finally:
        driver.cuCtxSetCurrent(before)


def device_options(dev: Any) -> Any:
    """Options for a request that has none: the device's own architecture."""
    from cuda.core import ProgramOptions

    major, minor = dev.compute_capability
    return ProgramOptions(arch=f"sm_{major}{minor}")
