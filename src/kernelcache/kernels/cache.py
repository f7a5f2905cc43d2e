"""KernelCache: loaded kernels per device (L1, a GuardedCache per device) over compiled bytes (L2).

L1 is keyed by what the caller passes (source, kernel name, options' values, ...), so a
hit costs a dictionary look-up, not a key derivation. L2 is compile_program and its byte
store. Each device has its own GuardedCache, hence its own lock: threads driving
different GPUs never contend.

L1 does not re-read headers on a hit: a header edited while a process runs is seen by new
processes (L2 checks headers on every look-up) and by this one after ``clear()``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.compile.batch import REQUEST_FIELDS, CompileManyError, normalize_requests, run_batch
from kernelcache.compile.flow import CompileInfo, compile_program
from kernelcache.kernels.guarded import GuardedCache
from kernelcache.kernels.loader import device_options, heals, kernel_of, on_device
from kernelcache.keys.options import options_fingerprint
from kernelcache.log import KernelCacheWarning
from kernelcache.stores.base import ProgramCacheResource
from kernelcache.stores.cuda_core import as_store

if TYPE_CHECKING:
    from cuda.core import Kernel, ObjectCode, ProgramOptions

__all__ = ["KernelCache", "LoadedKernel", "l1_key"]

_GET_KERNELS_FIELDS = REQUEST_FIELDS | {"name"}


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


def _normalized(requests: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return normalize_requests(requests, _GET_KERNELS_FIELDS, "get_kernels")


def _names(name_expressions: Any, where: str = "") -> tuple[str | bytes, ...]:
    """The name expressions as a tuple; one str would be read letter by letter: TypeError."""
    if isinstance(name_expressions, (str, bytes)):
        raise TypeError(f"{where}name_expressions must be a sequence of names, not a single str/bytes")
    return tuple(name_expressions)


def _request_args(r: dict[str, Any]) -> dict[str, Any]:
    """A get_kernels request as the keyword arguments of l1_key and KernelCache._load
    (options apart), defaults filled."""
    return {
        "code": r["code"],
        "name": r["name"],
        "code_type": r.get("code_type", "c++"),
        "target_type": r.get("target_type", "cubin"),
        "names": r["name_expressions"],
        "extra_digest": r.get("extra_digest"),
    }


def l1_key(
    code: str | bytes,
    name: str,
    code_type: str,
    target_type: str,
    names: tuple[str | bytes, ...],
    extra_digest: bytes | None,
    options: Any,
) -> Any:
    """The L1 key of a request: what the caller passed, options by value (a mutated
    ProgramOptions is a new entry); not exact about True versus 1 in one field, which only
    an ill-typed option could tell apart. get_kernel's hit path builds the same key inline."""
    fields = getattr(options, "__dict__", None)
    token: Any = tuple(fields.values()) if fields is not None else options
    key = (code, name, code_type, target_type, names, extra_digest, token)
    try:
        hash(key)
    except TypeError:  # a list-valued option (include paths...): the slower exact snapshot
        exact = options_fingerprint(options) or ("id", id(options))
        key = (code, name, code_type, target_type, names, extra_digest, exact)
    return key


def _no_gpu_reason(exc: BaseException) -> str | None:
    """Why there is no GPU to load on, if ``exc`` says so; None for any other error."""
    if type(exc).__name__ == "DynamicLibNotFoundError":
        return "no NVIDIA driver found (libcuda.so.1 cannot be loaded)"
    if "CUDA_ERROR_NO_DEVICE" in str(exc):
        return "the NVIDIA driver found no CUDA device"
    return None


class KernelCache:
    """Loaded kernels per GPU, built through compile_program on a miss.

    ``cache``: the L2 byte store (default: compile_program's default FileStreamProgramCache).
    """

    def __init__(self, cache: ProgramCacheResource | None = None) -> None:
        # kernelcache's stores as they are; cuda.core's wrapped (see stores/cuda_core.py)
        self._store = as_store(cache) if cache is not None else None
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

        try:
            if device is None:
                return Device()  # the current device of this thread
            if isinstance(device, int):
                return Device(device)
        except Exception as exc:
            why = _no_gpu_reason(exc)
            if why is None:
                raise
            # One line instead of a traceback through the driver loader (as the demo says it).
            raise RuntimeError(
                f"kernelcache.KernelCache needs a CUDA GPU: {why}; compile_program() compiles and caches without one"
            ) from None
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
        (an L2 hit loads bytes, a miss compiles), then the module is loaded on the device;
        the calling thread's current context is the same afterwards. An artifact whose
        bytes the driver refuses is evicted from L2, recompiled once, and loaded: a corrupt
        shared cache heals itself. A ``name`` the program does not have raises ValueError
        (nothing evicted, nothing recompiled); a driver that cannot load a good entry
        (PTX too new for it, say) raises the driver's error and keeps the entry.
        """
        # The hit path is kept flat: no Device object, no key derivation, no closure.
        names = name_expressions if type(name_expressions) is tuple else _names(name_expressions)
        device_id = device if type(device) is int else self._device(device).device_id
        shard = self._shards.get(device_id) or self._shard(device_id)
        fields = getattr(options, "__dict__", None)  # l1_key's key, inlined: 0.2 us of 2
        key: Any = (
            code,
            name,
            code_type,
            target_type,
            names,
            extra_digest,
            tuple(fields.values()) if fields is not None else options,
        )
        try:
            loaded = shard.peek(key)
        except TypeError:  # a list-valued option: l1_key takes the exact snapshot
            key = l1_key(code, name, code_type, target_type, names, extra_digest, options)
            loaded = shard.peek(key)
        if loaded is not None:
            kernel = loaded.kernel
            if kernel is not None:
                return kernel
        return self._build(
            shard, key, device, device_id, code, name, options, code_type, target_type, names, extra_digest
        )

    def _build(
        self,
        shard: Any,
        key: Any,
        device: Any,
        device_id: int,
        code: str | bytes,
        name: str,
        options: ProgramOptions | None,
        code_type: str,
        target_type: str,
        names: tuple[str | bytes, ...],
        extra_digest: bytes | None,
    ) -> Kernel:
        """get_kernel's L1 miss: compile (or read L2) and load once per key, under single flight."""
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

    def get_kernels(self, requests: Iterable[Mapping[str, Any]], *, device: Any = None) -> list[Kernel]:
        """get_kernel for every request at once, on one device; the kernels in request order.

        Each request is a mapping of get_kernel's arguments: ``code`` and ``name``, and
        optionally ``code_type``, ``target_type``, ``options``, ``name_expressions``,
        ``extra_digest``. L1 hits are returned as they are; the rest go through
        compile_many (hits first, misses compiled on threads, keys a peer process holds
        taken last), then are loaded. A request that fails does not stop the others:
        CompileManyError then carries ``.errors`` (request index -> exception) and
        ``.results`` (the kernels, None where failed).
        """
        reqs = [dict(r) for r in _normalized(requests)]
        if not reqs:
            return []
        for i, r in enumerate(reqs):  # wrong arguments raise before anything else is asked of the GPU
            r["name_expressions"] = _names(r.get("name_expressions", ()), f"get_kernels: request #{i}: ")
        device_id = device if type(device) is int else self._device(device).device_id
        shard = self._shard(device_id)
        out: list[Any] = [None] * len(reqs)
        missing: list[tuple[int, Any]] = []
        for i, r in enumerate(reqs):
            key = l1_key(options=r.get("options"), **_request_args(r))
            loaded = shard.peek(key)
            kernel = loaded.kernel if loaded is not None else None
            if kernel is not None:
                out[i] = kernel
            else:
                missing.append((i, key))
        if not missing:
            return out
        dev = self._device(device)
        own = None  # options for the requests that have none: this device's arch
        for i, _ in missing:
            if reqs[i].get("options") is None:
                own = reqs[i]["options"] = own or device_options(dev)
        batch = run_batch(
            [reqs[i] for i, _ in missing], self._store, None, fields=_GET_KERNELS_FIELDS, what="get_kernels"
        )
        errors = {missing[j][0]: exc for j, exc in batch.errors.items()}
        with on_device(device_id):
            for j, (i, key) in enumerate(missing):
                if j in batch.errors:
                    continue
                obj, info, r = batch.results[j], batch.infos[j], reqs[i]
                try:
                    loaded = shard.find_or_build(
                        key, functools.partial(self._install, dev, obj, info, r), device_id=device_id
                    )
                    out[i] = loaded.kernel if loaded.kernel is not None else self._again(dev, r)
                except Exception as exc:
                    errors[i] = exc
        if errors:
            raise CompileManyError(errors, out)
        return out

    def _install(self, dev: Any, obj: ObjectCode, info: CompileInfo | None, r: dict[str, Any]) -> LoadedKernel:
        """Load a batch result; bytes the driver refuses go the healing way of get_kernel."""
        try:
            return LoadedKernel(obj, kernel_of(obj, r["name"], r["code"]))
        except ValueError:
            raise
        except Exception as exc:
            if info is None or not heals(
                exc, hit=info.hit, options=r["options"], compute_capability=dev.compute_capability
            ):
                raise
        return self._load(dev, options=r["options"], **_request_args(r))

    def _again(self, dev: Any, r: dict[str, Any]) -> Kernel:
        args = {k: v for k, v in r.items() if k not in ("code", "name")}
        return self.get_kernel(r["code"], r["name"], device=dev, **args)

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
        if options is None:
            options = device_options(dev)
        store = self._store
        with on_device(dev.device_id):
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
                    return LoadedKernel(obj, kernel_of(obj, name, code))
                except ValueError:
                    raise  # no such kernel: the caller's mistake, not the entry's
                except Exception as exc:
                    if attempt == 2 or not heals(
                        exc, hit=info.hit, options=options, compute_capability=dev.compute_capability
                    ):
                        raise
                    self._heal(store, info.key, exc)
        raise AssertionError("unreachable")

    @staticmethod
    def _heal(store: ProgramCacheResource | None, key: bytes, exc: BaseException) -> None:
        import warnings

        from kernelcache.log import logger
        from kernelcache.stores.default import default_cache
        from kernelcache.stores.safe import count_error

        target = store if store is not None else default_cache()
        message = f"the driver refused a cached artifact's bytes ({exc}); evicted it and recompiling"
        logger.warning("%s", message)
        warnings.warn(f"kernelcache: {message}", KernelCacheWarning, stacklevel=4)
        target.discard(key)
        count_error(target, "driver")

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
