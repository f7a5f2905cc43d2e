"""CuPy's RawModule and RawKernel, compiled through kernelcache.

Set-up::

    from kernelcache.cupy import RawModule, RawKernel   # instead of cupy.RawModule, cupy.RawKernel

Same arguments as CuPy's. The source is compiled by ``kernelcache.compile_program`` (header
tracking, one compile per key across threads, processes and hosts, the default store with
its Redis tier) with exactly the NVRTC command line CuPy itself would pass, in CuPy's order
(integrations/cupy_build.py: CuPy's include paths and default standard, your flags,
``-ftz=true``, the debug flags under ``CUPY_CUDA_COMPILE_WITH_DEBUG``, the device's arch,
``--device-as-default-execution-space``); the key hashes that command line in order. The
bytes are loaded into a CuPy module with the symbol mapping stored beside the entry, so
``get_function("kern<float>")`` works on a hit. As in CuPy: ``translate_cucomplex=True``
translates the source, ``-dc``/``-rdc=true`` link the compile against cudadevrt (the linked
cubin is cached too), a failed compile raises ``cupy.cuda.compiler.CompileException`` with
NVRTC's log. ``backend='nvcc'`` and ``jitify=True`` give CuPy's own object, compiled and
cached by CuPy, with one ``KernelCacheWarning``.

``KernelCacheBackend`` plugs kernelcache's store under every kernel CuPy compiles itself
(elementwise, reductions, its own RawModule) through CuPy 14's experimental, private hook
``cupy.cuda.compiler._set_kernel_cache_backend``: call ``install_backend()``.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from collections.abc import Sequence
from typing import Any

try:
    import cupy
    from cupy.cuda import function as _function
except ModuleNotFoundError as exc:  # pragma: no cover - exercised where cupy is absent
    # A ModuleNotFoundError, as Python's own: `pytest.importorskip` and `except
    # ModuleNotFoundError` treat a missing extra as missing. (A CuPy that is installed but
    # fails to import raises its own error, unchanged.)
    raise ModuleNotFoundError(
        "kernelcache.cupy needs CuPy: install it with `pip install 'kernelcache[cupy]'` (the CUDA 13 wheel)",
        name=exc.name,
    ) from exc

from kernelcache.compile import lockfile
from kernelcache.compile.metadata import decode_symbols
from kernelcache.compile.nvrtc_flags import option_fields
from kernelcache.integrations import cupy_build, cupy_index

__all__ = ["KernelCacheBackend", "RawKernel", "RawModule", "install_backend"]

# CuPy's own classes, taken now: a program (or a test suite) may put ours in their place on
# the cupy module, and a hand-off must still reach CuPy's.
_CUPY_RAW_KERNEL = cupy.RawKernel
_CUPY_RAW_MODULE = cupy.RawModule


def _handed_off(cls: type, cupys: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """CuPy's own object (``cupys``, built from the very same arguments) for what kernelcache
    does not compile, with one warning saying so; None when kernelcache compiles it."""
    try:
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
    except TypeError:
        return None  # wrong arguments: our __init__ raises CuPy's TypeError for them
    bound.apply_defaults()
    given = bound.arguments
    if given.get("code") is None:
        return None  # RawModule(path=...): CuPy's own loader, inside our class
    translate, jitify = given["translate_cucomplex"], given["jitify"]
    reason = cupy_build.handoff_reason(given["backend"], given["options"], translate, jitify)
    if reason is None:
        return None
    from kernelcache.stores.base import KernelCacheWarning

    warnings.warn(
        f"kernelcache.cupy: {reason} is compiled and cached by CuPy itself, not by kernelcache",
        KernelCacheWarning,
        stacklevel=3,
    )
    return cupys(*args, **kwargs)


def _check_options(options: Any) -> tuple[str, ...]:
    option_fields(options)  # a flag kernelcache cannot vouch for raises now, naming it
    return tuple(options)


class _Compiled:
    """One compile per (source, options, name expressions, device): the CuPy module."""

    def __init__(
        self, code: str, options: tuple[str, ...], name_expressions: tuple[str, ...] | None, translate_cucomplex: bool
    ) -> None:
        self.code = code
        self.options = options
        self.name_expressions = name_expressions
        self.translate_cucomplex = translate_cucomplex
        self._modules: dict[int, Any] = {}
        self._lock = threading.Lock()

    def module(self, log_stream: Any = None) -> Any:
        device = cupy.cuda.runtime.getDevice()
        mod = self._modules.get(device)
        if mod is not None:
            return mod
        with self._lock:  # one compile per instance and device; compile_program does the rest
            mod = self._modules.get(device)
            if mod is None:
                cubin, mapping = self._build(log_stream)
                mod = _function.Module()
                mod.load(cubin)
                mod._set_mapping({_text(k): _text(v) for k, v in mapping.items()})
                self._modules[device] = mod
        return mod

    def _build(self, log_stream: Any) -> tuple[bytes, dict[Any, Any]]:
        from kernelcache.stores.default import default_cache_or_none

        source = cupy_build.source_for_nvrtc(self.code, self.translate_cucomplex)
        argv, target = cupy_build.command_line(self.options)
        store = default_cache_or_none() if cupy_index.usable() else None
        index = cupy_index.index_key(source, argv, target, self.name_expressions) if store is not None else b""
        found = cupy_index.find(store, index) if index else None
        if found is not None:  # a warm hit: no cuda.core import, no key derivation
            lockfile.record_argv(source, target, argv, self.name_expressions or ())  # as compile_program records
            entry_key, payload, meta = found
            if log_stream is not None and meta.get("log"):
                log_stream.write(meta["log"])
            return self._linked(store, payload, argv, entry_key, decode_symbols(meta.get("symbols")))
        return self._compile(source, argv, target, log_stream, index)

    def _compile(
        self, source: str, argv: tuple[str, ...], target: str, log_stream: Any, index: bytes
    ) -> tuple[bytes, dict[Any, Any]]:
        from cuda.core._utils.cuda_utils import NVRTCError

        from kernelcache.compile.flow import CompileInfo, compile_program
        from kernelcache.compile.nvrtc_argv import argv_options
        from kernelcache.headers.scan import may_read_files
        from kernelcache.stores.default import default_cache_or_none

        options = argv_options(argv)
        info = CompileInfo()
        try:
            obj = compile_program(
                source,
                "c++",
                target,
                options=options,
                name_expressions=self.name_expressions or (),
                logs=log_stream,
                info=info,
            )
        except NVRTCError as exc:
            raise cupy_build.compile_exception(exc, source, argv) from None
        store = default_cache_or_none() if info.cached else None
        names = self.name_expressions or ()
        if store is not None and index and info.key and not may_read_files(source, options, names):
            cupy_index.remember(store, index, info.key)
        mapping = getattr(obj, "symbol_mapping", None) or {}
        return self._linked(store, bytes(obj.code), argv, info.key, mapping)

    @staticmethod
    def _linked(
        store: Any, code: bytes, argv: tuple[str, ...], key: bytes, mapping: dict[Any, Any]
    ) -> tuple[bytes, dict[Any, Any]]:
        if cupy_build.needs_cudadevrt(argv):  # CuPy links relocatable code with cudadevrt
            kernels = sorted(_text(v) for v in mapping.values())
            code = cupy_build.link_cudadevrt(store, key, code, kernels)
        return code, mapping


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class RawKernel(_CUPY_RAW_KERNEL):  # type: ignore[misc, valid-type]
    """``cupy.RawKernel(code, name, options=(), backend="nvrtc", *, translate_cucomplex=False,
    enable_cooperative_groups=False, jitify=None)`` compiled by kernelcache.

    Launch, attributes and ``compile()`` are CuPy's; only where the binary comes from differs.
    ``backend='nvcc'`` and ``jitify=True`` return CuPy's own RawKernel (one KernelCacheWarning).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        own = _handed_off(cls, _CUPY_RAW_KERNEL, args, kwargs)
        return own if own is not None else super().__new__(cls)

    def __init__(
        self,
        code: str,
        name: str,
        options: tuple[str, ...] = (),
        backend: str = "nvrtc",
        *,
        translate_cucomplex: bool = False,
        enable_cooperative_groups: bool = False,
        jitify: Any = None,
    ) -> None:
        options = _check_options(options)
        super().__init__(
            code,
            name,
            options,
            backend,
            translate_cucomplex=translate_cucomplex,
            enable_cooperative_groups=enable_cooperative_groups,
            **({} if jitify is None else {"jitify": jitify}),  # CuPy warns that jitify=False is deprecated
        )  # jitify=True went to CuPy's own class
        self._compiled = _Compiled(code, options, None, translate_cucomplex)
        self._functions: dict[int, Any] = {}

    def __setstate__(self, args: dict[str, Any]) -> None:
        super().__setstate__(args)
        names = args.get("name_expressions")
        self._compiled = _Compiled(args["code"], tuple(args["options"]), names, bool(args.get("translate_cucomplex")))
        self._functions = {}

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


class RawModule(_CUPY_RAW_MODULE):  # type: ignore[misc, valid-type]
    """``cupy.RawModule(*, code=None, path=None, options=(), ..., name_expressions=None)``
    compiled by kernelcache; ``path=`` (a prebuilt cubin/PTX) is CuPy's own loader.
    ``backend='nvcc'`` and ``jitify=True`` return CuPy's own RawModule (one KernelCacheWarning)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        own = _handed_off(cls, _CUPY_RAW_MODULE, args, kwargs)
        return own if own is not None else super().__new__(cls)

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
        jitify: Any = None,
    ) -> None:
        if code is not None:
            options = _check_options(options)
        super().__init__(
            code=code,
            path=path,
            options=tuple(options),
            backend=backend,
            translate_cucomplex=translate_cucomplex,
            enable_cooperative_groups=enable_cooperative_groups,
            name_expressions=name_expressions,
            **({} if jitify is None else {"jitify": jitify}),  # CuPy warns that jitify=False is deprecated
        )
        names = tuple(name_expressions) if name_expressions is not None else None
        self._compiled = _Compiled(code, tuple(options), names, translate_cucomplex) if code is not None else None

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by its arguments (as CuPy pickles its RawKernel): the compiled modules and
        # their lock stay behind, and the unpickled module compiles (or loads) anew.
        compiled = self._compiled
        arguments = (
            {"path": self.file_path}
            if compiled is None
            else {
                "code": compiled.code,
                "options": compiled.options,
                "translate_cucomplex": compiled.translate_cucomplex,
                "name_expressions": compiled.name_expressions,
            }
        )
        return (_rebuild_module, (arguments, self.enable_cooperative_groups))

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
            translate_cucomplex=self._compiled.translate_cucomplex,
            enable_cooperative_groups=self.enable_cooperative_groups,
        )
        kernel._compiled = self._compiled  # share the module: one compile for all its kernels
        kernel._kernel()  # like CuPy: a missing kernel raises here, not at launch
        return kernel


def _rebuild_module(arguments: dict[str, Any], enable_cooperative_groups: bool) -> RawModule:
    return RawModule(**arguments, enable_cooperative_groups=enable_cooperative_groups)


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
