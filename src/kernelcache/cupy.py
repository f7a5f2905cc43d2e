"""CuPy's RawModule and RawKernel, compiled through kernelcache.

Set-up::

    from kernelcache.cupy import RawModule, RawKernel   # instead of cupy.RawModule, cupy.RawKernel

Same arguments as CuPy's. The source is compiled by ``kernelcache.compile_program`` (header
tracking, one compile per key across threads, processes and hosts, the default store with
its Redis tier) with the options CuPy itself would pass NVRTC: CuPy's include paths and
default C++ standard, ``-ftz=true``, the current device's architecture and
``--device-as-default-execution-space``. The bytes are loaded into a CuPy module with the
symbol mapping stored beside the entry, so ``get_function("kern<float>")`` works on a hit.

``KernelCacheBackend`` plugs kernelcache's store under every kernel CuPy compiles itself
(elementwise, reductions, its own RawModule) through CuPy 14's experimental, private hook
``cupy.cuda.compiler._set_kernel_cache_backend``: call ``install_backend()``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

try:
    import cupy
    from cupy.cuda import function as _function
except ImportError as exc:  # pragma: no cover - exercised where cupy is absent
    raise ImportError(
        "kernelcache.cupy needs CuPy: install it with `pip install 'kernelcache[cupy]'` (the CUDA 13 wheel)"
    ) from exc

from kernelcache.integrations.nvrtc_flags import option_fields, program_options

__all__ = ["KernelCacheBackend", "RawKernel", "RawModule", "install_backend"]


def _refuse_unsupported(backend: str, translate_cucomplex: bool, jitify: bool) -> None:
    what = None
    if backend != "nvrtc":
        what = f"backend={backend!r} (kernelcache compiles with NVRTC)"
    elif translate_cucomplex:
        what = "translate_cucomplex=True"
    elif jitify:
        what = "jitify=True"
    if what is not None:
        raise ValueError(f"kernelcache.cupy does not support {what}; use cupy.RawModule/cupy.RawKernel for it")


def _cupy_options(options: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
    """The NVRTC options CuPy would use for ``options`` on the current device, and the
    target type (cubin, or ptx where NVRTC cannot build the device's SASS)."""
    from cupy._core import core
    from cupy.cuda import compiler

    arch_opt, method = compiler._get_arch_for_options_for_nvrtc(compiler._get_arch())
    full = core.assemble_cupy_compiler_options(tuple(options))
    return (*full, "-ftz=true", arch_opt, "--device-as-default-execution-space"), method


class _Compiled:
    """One compile per (source, options, name expressions, device): the CuPy module."""

    def __init__(self, code: str, options: tuple[str, ...], name_expressions: tuple[str, ...] | None) -> None:
        self.code = code
        self.options = options
        self.name_expressions = name_expressions
        self._modules: dict[int, Any] = {}
        self._lock = threading.Lock()

    def module(self, log_stream: Any = None) -> Any:
        from kernelcache.compile.flow import compile_program

        device = cupy.cuda.runtime.getDevice()
        mod = self._modules.get(device)
        if mod is not None:
            return mod
        with self._lock:  # one compile per instance and device; compile_program does the rest
            mod = self._modules.get(device)
            if mod is None:
                nvrtc_options, target = _cupy_options(self.options)
                obj = compile_program(
                    self.code,
                    "c++",
                    target,
                    options=program_options(nvrtc_options),
                    name_expressions=self.name_expressions or (),
                    logs=log_stream,
                )
                mod = _function.Module()
                mod.load(bytes(obj.code))
                mapping = getattr(obj, "symbol_mapping", None) or {}
                mod._set_mapping({_text(k): _text(v) for k, v in mapping.items()})
                self._modules[device] = mod
        return mod


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class RawKernel(cupy.RawKernel):
    """``cupy.RawKernel(code, name, options=(), backend="nvrtc", *, ...)`` compiled by kernelcache.

    Launch, attributes and ``compile()`` are CuPy's; only where the binary comes from differs.
    """

    def __init__(
        self,
        code: str,
        name: str,
        options: tuple[str, ...] = (),
        backend: str = "nvrtc",
        *,
        translate_cucomplex: bool = False,
        enable_cooperative_groups: bool = False,
        jitify: bool = False,
    ) -> None:
        _refuse_unsupported(backend, translate_cucomplex, jitify)
        option_fields(options)  # a bad option raises now, not at the first launch
        super().__init__(
            code,
            name,
            tuple(options),
            backend,
            translate_cucomplex=translate_cucomplex,
            enable_cooperative_groups=enable_cooperative_groups,
        )  # jitify is refused above, and CuPy 14 warns when it is passed at all
        self._compiled = _Compiled(code, tuple(options), None)
        self._functions: dict[int, Any] = {}

    def _kernel(self, log_stream: Any = None) -> Any:
        device = cupy.cuda.runtime.getDevice()
        function = self._functions.get(device)
        if function is None:
            function = self._functions[device] = self._compiled.module(log_stream).get_function(self.name)
        return function

    def compile(self, log_stream: Any = None) -> None:
        """Compile (or load from the cache) now instead of at the first launch."""
        self._functions.clear()
        self._kernel(log_stream)


class RawModule(cupy.RawModule):
    """``cupy.RawModule(*, code=None, path=None, options=(), ..., name_expressions=None)``
    compiled by kernelcache; ``path=`` (a prebuilt cubin/PTX) is CuPy's own loader."""

    def __init__(
        self,
        *,
        code: str | None = None,
        path: str | None = None,
        options: tuple[str, ...] = (),
        backend: str = "nvrtc",
        translate_cucomplex: bool = False,
        enable_cooperative_groups: bool = False,
        name_expressions: Sequence[str] | None = None,
        jitify: bool = False,
    ) -> None:
        if code is not None:
            _refuse_unsupported(backend, translate_cucomplex, jitify)
            option_fields(options)
        super().__init__(
            code=code,
            path=path,
            options=tuple(options),
            backend=backend,
            translate_cucomplex=translate_cucomplex,
            enable_cooperative_groups=enable_cooperative_groups,
            name_expressions=name_expressions,
        )
        names = tuple(name_expressions) if name_expressions is not None else None
        self._compiled = _Compiled(code, tuple(options), names) if code is not None else None

    def _module(self, log_stream: Any = None) -> Any:
        if self._compiled is None:
            return super()._module(log_stream)
        return self._compiled.module(log_stream)

    def get_function(self, name: str) -> RawKernel | Any:
        """The kernel ``name``: a name expression given at construction, or a plain name."""
        if self._compiled is None:
            return super().get_function(name)
        mapped = self._compiled.module().mapping.get(name) if self._compiled.name_expressions else None
        kernel = RawKernel(
            self.code,
            mapped or name,
            self._compiled.options,
            enable_cooperative_groups=self.enable_cooperative_groups,
        )
        kernel._compiled = self._compiled  # share the module: one compile for all its kernels
        kernel._kernel()  # like CuPy: a missing kernel raises here, not at launch
        return kernel


try:  # CuPy >= 14: an experimental, private kernel-cache backend hook
    from cupy.cuda._compiler_cache import KernelCacheBackend as _CupyBackend

    _HAS_HOOK = True
except ImportError:  # pragma: no cover - older CuPy: the class exists, install_backend refuses
    _CupyBackend = object
    _HAS_HOOK = False


class KernelCacheBackend(_CupyBackend):  # type: ignore[misc, valid-type]
    """CuPy's kernel-cache backend storing in kernelcache's default store.

    CuPy names each entry by its own key (a SHA-1 of source, options, NVRTC version and
    bundled headers; headers outside CuPy's are not tracked by that key). The payload
    is CuPy's, stored verbatim and checked by the store on every read.
    """

    _DOMAIN = b"kernelcache.cupy.backend/1\x00"

    @staticmethod
    def _current() -> Any:
        """The default store, looked up per call as compile_program does; None (an empty
        cache that keeps nothing) under KERNELCACHE_DISABLE, or when the default cache
        directory cannot be used (warned once): CuPy then compiles as without a cache."""
        from kernelcache import config
        from kernelcache.stores.default import default_cache_or_none

        return None if config.disabled() else default_cache_or_none()

    def load(self, name: str) -> bytes | None:
        store = self._current()
        if store is None:
            return None
        record = store.get_record(self._DOMAIN + name.encode("utf-8"))
        return None if record is None else record[0]

    def save(self, name: str, cubin: bytes, source: str) -> None:
        store = self._current()
        if store is None:
            return
        meta = {"kind": "cupy", "code_type": "cupy", "target_type": name.rsplit(".", 1)[-1], "kernels": [name]}
        store.set_record(self._DOMAIN + name.encode("utf-8"), cubin, meta)


def install_backend() -> None:
    """Make kernelcache's default store the backend of CuPy's own kernel cache (CuPy >= 14)."""
    if not _HAS_HOOK:
        raise RuntimeError(
            f"CuPy {cupy.__version__} has no kernel-cache backend hook (CuPy 14 added one); "
            "use kernelcache.cupy.RawModule/RawKernel instead"
        )
    from cupy.cuda import compiler

    compiler._set_kernel_cache_backend(KernelCacheBackend())
