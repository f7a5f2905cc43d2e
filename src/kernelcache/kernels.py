"""KernelCache: loaded kernels per device (L1, a GuardedCache per device) over compiled bytes (L2).

L1 is keyed by what the caller passes (source, kernel name, options' values, ...), so a
hit costs a dictionary look-up, not a key derivation. L2 is compile_program and its byte
store. Each device has its own GuardedCache, hence its own lock: threads driving
different GPUs never contend.

L1 does not re-read headers on a hit: a header edited while a process runs is seen by new
processes (L2 checks headers on every look-up) and by this one after ``clear()``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.compile import CompileInfo, compile_program
from kernelcache.guarded import GuardedCache
from kernelcache.keys import options_fingerprint
from kernelcache.stores.base import KernelCacheWarning, ProgramCacheResource

if TYPE_CHECKING:
    from cuda.core import Kernel, ObjectCode, ProgramOptions

__all__ = ["KernelCache", "LoadedKernel"]

# Driver errors that mean "these bytes are not a loadable image": the artifact in L2 is bad
# (corrupt, truncated, built for another GPU) and recompiling it will fix the problem.
_BAD_IMAGE_ERRORS = (
    "CUDA_ERROR_INVALID_IMAGE",
    "CUDA_ERROR_INVALID_PTX",
    "CUDA_ERROR_NO_BINARY_FOR_GPU",
    "CUDA_ERROR_INVALID_SOURCE",
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
    "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
    "CUDA_ERROR_NOT_FOUND",
)


class LoadedKernel:
    """What L1 holds for one (kernel, device): the ObjectCode (its module) and the Kernel."""

    __slots__ = ("object_code", "kernel")

    def __init__(self, object_code: ObjectCode, kernel: Kernel) -> None:
        self.object_code: ObjectCode | None = object_code
        self.kernel: Kernel | None = kernel

    def release(self) -> None:
        # cuda.core unloads a module when its last reference goes; dropping ours is the
        # release (a caller that still holds the Kernel keeps the module alive, safely).
        self.object_code = None
        self.kernel = None


def _is_bad_image(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}"
    return any(code in text for code in _BAD_IMAGE_ERRORS)


class KernelCache:
    """Loaded kernels per GPU, built through compile_program on a miss.

    ``cache``: the L2 byte store (default: compile_program's default FileStreamProgramCache).
    """

    def __init__(self, cache: ProgramCacheResource | None = None) -> None:
        if cache is not None and not isinstance(cache, ProgramCacheResource):
            raise TypeError(f"cache must be a ProgramCacheResource or None, not {type(cache).__name__}")
        self._store = cache
        self._shards: dict[int, GuardedCache[LoadedKernel]] = {}
        self._shards_lock = threading.Lock()

    def _shard(self, device_id: int) -> GuardedCache[LoadedKernel]:
        shard = self._shards.get(device_id)
        if shard is None:
            with self._shards_lock:
                shard = self._shards.get(device_id)
                if shard is None:
                    shard = self._shards[device_id] = GuardedCache(LoadedKernel.release)
        return shard

    @staticmethod
    def _device(device: Any) -> Any:
        from cuda.core import Device

        if device is None:
            return Device()  # the current device of this thread
        if isinstance(device, int):
            return Device(device)
        return device

    def get_kernel(
        self,
        code: str | bytes,
        name: str,
        *,
        options: ProgramOptions | None = None,
        code_type: str = "c++",
        device: Any = None,
        name_expressions: Sequence[str | bytes] = (),
        target_type: str = "cubin",
        extra_digest: bytes | None = None,
    ) -> Kernel:
        """The kernel ``name`` of ``code``, loaded on ``device`` (default: the current one).

        L1 hit: a dictionary look-up under this device's lock. L1 miss: compile_program
        (an L2 hit loads bytes, a miss compiles), then the module is loaded on the device.
        An artifact that the driver refuses to load is evicted from L2, recompiled once, and
        loaded: a corrupt shared cache heals itself.
        """
        # The hit path is kept flat: no Device object, no key derivation, no closure.
        device_id = device if type(device) is int else self._device(device).device_id
        # Options by value (a mutated ProgramOptions is a new entry); not exact about True
        # versus 1 in one field, which only an ill-typed option could tell apart.
        fields = getattr(options, "__dict__", None)
        token: Any = tuple(fields.values()) if fields is not None else options
        names = name_expressions if type(name_expressions) is tuple else tuple(name_expressions)
        key = (code, name, code_type, target_type, names, extra_digest, token)
        shard = self._shards.get(device_id) or self._shard(device_id)
        try:
            loaded = shard.peek(key)
        except TypeError:  # a list-valued option (include paths...): the slower exact snapshot
            exact = options_fingerprint(options) or ("id", id(options))
            key = (code, name, code_type, target_type, names, extra_digest, exact)
            loaded = shard.peek(key)
        if loaded is not None:
            kernel = loaded.kernel
            if kernel is not None:
                return kernel
        dev = self._device(device)
        loaded = shard.find_or_build(
            key,
            lambda: self._load(dev, code, name, options, code_type, target_type, names, extra_digest),
            device_id=device_id,
        )
        kernel = loaded.kernel
        if kernel is None:  # released by a concurrent clear/evict after our look-up: build anew
            return self.get_kernel(
                code,
                name,
                options=options,
                code_type=code_type,
                device=dev,
                name_expressions=names,
                target_type=target_type,
                extra_digest=extra_digest,
            )
        return kernel

    def _load(
        self,
        dev: Any,
        code: str | bytes,
        name: str,
        options: Any,
        code_type: str,
        target_type: str,
        names: tuple[str | bytes, ...],
        extra_digest: bytes | None,
    ) -> LoadedKernel:
        from cuda.core import ProgramOptions

        dev.set_current()
        if options is None:
            major, minor = dev.compute_capability
            options = ProgramOptions(arch=f"sm_{major}{minor}")
        store = self._store
        for attempt in (1, 2):
            info = CompileInfo()
            obj = compile_program(
                code,
                code_type,
                target_type,
                options=options,
                cache=store,
                name_expressions=names,
                extra_digest=extra_digest,
                info=info,
            )
            try:
                return LoadedKernel(obj, obj.get_kernel(name))
            except Exception as exc:
                if attempt == 2 or not info.hit or not _is_bad_image(exc):
                    raise
                self._heal(store, info.key, exc)
        raise AssertionError("unreachable")

    @staticmethod
    def _heal(store: ProgramCacheResource | None, key: bytes, exc: BaseException) -> None:
        import warnings

        from kernelcache.compile import default_cache

        target = store if store is not None else default_cache()
        warnings.warn(
            f"kernelcache: the driver refused a cached artifact ({exc}); evicted it and recompiling",
            KernelCacheWarning,
            stacklevel=4,
        )
        target.discard(key)
        target.add_stats(errors=1)

    def evict_device(self, device: Any) -> None:
        """Drop this cache's references to every kernel of ``device`` (an int or a cuda.core Device).

        cuda.core unloads a module when its last reference goes: a kernel a caller still
        holds stays loaded until the caller drops it. Builds for the device in flight are
        discarded, not installed.
        """
        device_id = device if isinstance(device, int) else device.device_id
        self._shard(device_id).evict_device(device_id)

    def clear(self) -> None:
        """Drop this cache's references to every kernel on every device (see evict_device)."""
        with self._shards_lock:
            shards = list(self._shards.values())
        first: BaseException | None = None
        for shard in shards:
            try:
                shard.clear()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def __len__(self) -> int:
        with self._shards_lock:
            return sum(len(s) for s in self._shards.values())

    def close(self) -> None:
        self.clear()

    def __enter__(self) -> KernelCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
