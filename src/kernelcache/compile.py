"""compile_program(): key -> store.get -> single-flight compile -> store.set; logs and symbols replayed.

On a hit no compiler runs: the stored bytes come back as an ObjectCode of the right kind,
with the NVRTC symbol mapping (name expressions) and the compile log of the original miss.
For C++ the key also covers every header the compile read (see headers.py).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache import headers as hdr
from kernelcache.keys import OPTION_POLICY, TRACKED, _is_set, digest_components, key_components, options_fingerprint
from kernelcache.memo import remember
from kernelcache.singleflight import single_flight
from kernelcache.stores.base import KernelCacheWarning, Meta, ProgramCacheResource, RecordStore, as_value_bytes
from kernelcache.stores.filestream import FileStreamProgramCache
from kernelcache.toolchain import toolchain_for

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions

__all__ = ["CompileInfo", "compile_program", "default_cache", "probe"]


@dataclasses.dataclass
class CompileInfo:
    """What one compile_program call did; pass ``info=CompileInfo()`` to receive it."""

    hit: bool = False  # True: no compiler ran in this call
    key: bytes = b""  # the entry's key (for C++ it includes the headers' digest)
    seconds: float = 0.0  # wall time of the whole call
    compile_seconds: float = 0.0  # on a miss: this compile; on a hit: the compile it saved
    lookup_seconds: float = 0.0  # key derivation + store look-ups before the compile
    store_seconds: float = 0.0  # writing the artifact (and header manifest) on a miss
    waited: bool = False  # another thread/process compiled it while we waited
    cached: bool = True  # False when KERNELCACHE_DISABLE=1 or the store could not be used
    headers: list[str] = dataclasses.field(default_factory=list)  # headers the key covers

    @property
    def key_hex(self) -> str:
        return self.key.hex()


# -- the default cache ------------------------------------------------------------------

_default_lock = threading.Lock()
_default_caches: dict[str, FileStreamProgramCache] = {}


def default_cache() -> FileStreamProgramCache:
    """The process-wide FileStreamProgramCache at ``KERNELCACHE_DIR`` (or platformdirs)."""
    root = config.cache_dir()
    with _default_lock:
        cache = _default_caches.get(root)
        if cache is None:
            cache = _default_caches[root] = FileStreamProgramCache(root)
        return cache


# -- compiling ----------------------------------------------------------------------------


class _LogCollector:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def text(self) -> str:
        return "".join(self.parts).rstrip("\x00")


def _as_source_text(code: str | bytes) -> str:
    if isinstance(code, str):
        return code
    try:
        return bytes(code).decode("utf-8")
    except UnicodeDecodeError:
        # cuda.core hands NVRTC a str; Latin-1 maps every byte to one character, so the
        # compile sees the same characters (non-ASCII bytes only ever sit in comments or
        # string literals of real sources). The key hashes the original bytes.
        return bytes(code).decode("latin-1")


@functools.cache
def driver_available() -> bool:
    """Whether a CUDA driver library can be loaded in this process (probed once)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def _nvrtc_check(result: Any, what: str) -> None:
    from cuda.bindings import nvrtc

    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")


def _nvrtc_ptx_without_driver(
    code: str, options: ProgramOptions, name_expressions: Sequence[str | bytes], log: _LogCollector
) -> ObjectCode:
    """C++ -> PTX with NVRTC alone, for machines with no driver.

    cuda.core 1.2's Program.compile("ptx") asks the driver whether the PTX can be loaded and
    raises where there is none; PTX generation itself never needed a driver.
    """
    from cuda.bindings import nvrtc
    from cuda.core import ObjectCode

    name = (options.name or "default_program").encode()
    err, prog = nvrtc.nvrtcCreateProgram(code.encode("utf-8"), name, 0, [], [])
    _nvrtc_check(err, "nvrtcCreateProgram")
    try:
        for expr in name_expressions:
            raw = expr if isinstance(expr, bytes) else expr.encode()
            _nvrtc_check(nvrtc.nvrtcAddNameExpression(prog, raw), "nvrtcAddNameExpression")
        flags = options.as_bytes("nvrtc")
        result = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        # Output buffers are fresh bytearrays: NVRTC writes into them in place, and a bytes
        # object such as b" " * 1 is an interpreter-wide singleton it would corrupt.
        err_log, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log.write(bytes(buf).decode(errors="replace"))
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            from cuda.core._utils.cuda_utils import NVRTCError  # the error cuda.core raises

            raise NVRTCError(f"{result[0]}: compile of {name.decode()} failed:\n{log.text()}")
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _nvrtc_check(err, "nvrtcGetPTXSize")
        ptx = bytearray(size)
        _nvrtc_check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        mapping = {}
        for expr in name_expressions:
            raw = expr if isinstance(expr, bytes) else expr.encode()
            err, lowered = nvrtc.nvrtcGetLoweredName(prog, raw)
            _nvrtc_check(err, "nvrtcGetLoweredName")
            mapping[expr] = lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return ObjectCode.from_ptx(bytes(ptx).rstrip(b"\x00"), name=options.name or "", symbol_mapping=mapping)


_RESET_SOURCE = 'extern "C" __global__ void kernelcache_trace_reset() {}\n'


def _reset_nvrtc_trace_state(trace_dir: str | None) -> None:
    """Work around an NVRTC bug seen with 13.5: after a compile that FAILS with
    -fdevice-time-trace, the process's next compile without that option still writes a trace,
    to ".json" in the current directory. A successful traced compile clears that state, so
    after a failed one we run a trivial traced compile into our temp dir."""
    from cuda.core import Program, ProgramOptions

    try:
        trace = os.path.join(trace_dir or tempfile.gettempdir(), "reset")
        options = ProgramOptions(arch="sm_90", fdevice_time_trace=trace)
        program = Program(_RESET_SOURCE, "c++", options=options)
        try:
            program.compile("cubin")  # NVRTC alone: no driver needed
        finally:
            program.close()
    except Exception:
        pass  # best effort: the user's own compile error is what gets raised


def _run_compiler(
    code: str | bytes,
    code_type: str,
    target_type: str,
    options: ProgramOptions,
    name_expressions: Sequence[str | bytes],
    trace_path: str | None,
) -> tuple[ObjectCode, str, float]:
    """Compile with the real compiler; return (object code, log text, seconds)."""
    from cuda.core import Program

    log = _LogCollector()
    start = time.perf_counter()
    if trace_path is not None:
        options = dataclasses.replace(options, fdevice_time_trace=trace_path)
    source: str | bytes = code if code_type == "nvvm" else _as_source_text(code)
    if code_type == "c++" and target_type == "ptx" and not driver_available():
        obj = _nvrtc_ptx_without_driver(str(source), options, name_expressions, log)
    else:
        program = Program(source, code_type, options=options)
        try:
            obj = program.compile(target_type, name_expressions=tuple(name_expressions), logs=log)
        finally:
            program.close()
    return obj, log.text(), time.perf_counter() - start


# -- metadata -----------------------------------------------------------------------------


def _encode_symbols(mapping: dict[Any, Any] | None) -> list[list[str]]:
    out = []
    for expr, mangled in (mapping or {}).items():
        ekind, etext = ("b", expr.decode("latin-1")) if isinstance(expr, bytes) else ("s", str(expr))
        vkind, vtext = ("b", mangled.decode("latin-1")) if isinstance(mangled, bytes) else ("s", str(mangled))
        out.append([ekind, etext, vkind, vtext])
    return out


def _decode_symbols(items: list[list[str]] | None) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for ekind, etext, vkind, vtext in items or ():
        expr = etext.encode("latin-1") if ekind == "b" else etext
        mapping[expr] = vtext.encode("latin-1") if vkind == "b" else vtext
    return mapping


@functools.cache
def _factories() -> dict[str, Any]:
    from cuda.core import ObjectCode

    return {
        "cubin": ObjectCode.from_cubin,
        "ptx": ObjectCode.from_ptx,
        "ltoir": ObjectCode.from_ltoir,
        "fatbin": ObjectCode.from_fatbin,
    }


def _object_from_bytes(data: bytes, target_type: str, name: str, meta: Meta) -> ObjectCode:
    symbols = meta.get("symbols")
    return _factories()[target_type](data, name=name, symbol_mapping=_decode_symbols(symbols) if symbols else None)


_GLOBAL_FN = re.compile(rb"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)")


def _kernel_names(code: str | bytes, mapping: dict[Any, Any] | None) -> list[str]:
    """Kernel names for listings: name expressions, else __global__ functions in the source."""
    if mapping:
        return [k.decode("latin-1") if isinstance(k, bytes) else str(k) for k in mapping]
    raw = code.encode("utf-8", "surrogatepass") if isinstance(code, str) else bytes(code)
    found = [m.decode("latin-1") for m in _GLOBAL_FN.findall(raw)]
    if not found:  # PTX: .entry names
        found = [m.decode("latin-1") for m in re.findall(rb"\.entry\s+(\w+)", raw)]
    return list(dict.fromkeys(found))[:32]


def _options_summary(options: Any) -> dict[str, str]:
    fields = getattr(options, "__dict__", {})
    return {k: repr(v) for k, v in fields.items() if v is not None}


# -- safe store access (a failing store never fails a compile) -----------------------------

_warned_foreign: set[str] = set()


def _warn_store(cache: ProgramCacheResource, what: str, exc: BaseException) -> None:
    cause = f"{type(cache).__name__}:{what}:{type(exc).__name__}"
    if cause not in _warned_foreign:
        _warned_foreign.add(cause)
        warnings.warn(
            f"kernelcache: the cache {type(cache).__name__} failed to {what} ({exc!r}); compiling without it",
            KernelCacheWarning,
            stacklevel=4,
        )
    try:
        cache.add_stats(errors=1)
    except Exception:
        pass


def _get(cache: ProgramCacheResource, key: bytes, counted: bool = True) -> tuple[bytes, Meta] | None:
    """An internal look-up: never a user hit/miss (the caller counts those itself)."""
    try:
        if not counted and isinstance(cache, RecordStore):
            return cache.get_record_uncounted(key)
        return cache.get_record(key, internal=True)
    except Exception as exc:
        _warn_store(cache, "read", exc)
        return None


def _set(cache: ProgramCacheResource, key: bytes, payload: Any, meta: Meta, internal: bool = False) -> None:
    try:
        cache.set_record(key, payload, meta, internal=internal)
    except Exception as exc:
        _warn_store(cache, "write", exc)


def _count(cache: ProgramCacheResource, **deltas: int) -> None:
    try:
        cache.add_stats(**deltas)
    except Exception:
        pass


def _lock_path(cache: ProgramCacheResource, key: bytes) -> str | None:
    lock_path = getattr(cache, "lock_path", None)
    if lock_path is None:
        return None
    try:
        return str(lock_path(key.hex() + ".lock"))
    except OSError:
        return None


# -- header manifests ----------------------------------------------------------------------

_manifest_memo_lock = threading.Lock()
_manifest_memo: dict[bytes, dict[str, Any]] = {}
_trace_unsupported = False


def _manifest_key(base: list[tuple[str, bytes]]) -> bytes:
    return digest_components([*base, ("manifest", b"%d" % hdr.MANIFEST_FORMAT)])


_full_key_memo: dict[tuple[bytes, str], bytes] = {}


def _full_key(base: list[tuple[str, bytes]], variant: dict[str, Any], manifest_key: bytes = b"") -> bytes:
    """The entry key: the base components plus the digest of the headers the compile read."""
    memo_key = (manifest_key, variant["digest"])
    key = _full_key_memo.get(memo_key) if manifest_key else None
    if key is None:
        key = digest_components([*base, ("headers", variant["digest"].encode())])
        if manifest_key:
            remember(_full_key_memo, memo_key, key, 4096)
    return key


def _matching_variant(
    cache: ProgramCacheResource, manifest_key: bytes, dirs: list[str], read_store: bool
) -> dict[str, Any] | None:
    """The first variant of this source's manifest whose headers still validate.

    Variants remembered in this process are tried first: any variant that validates gives
    a correct key (the key is derived from the header contents), so a stale memo can only
    cost a look-up, never serve wrong code.
    """
    with _manifest_memo_lock:
        manifest = _manifest_memo.get(manifest_key)
    for variant in (manifest or {}).get("variants", ()):
        if hdr.variant_matches(variant, dirs):
            return variant
    if not read_store:
        return None
    record = _get(cache, manifest_key)
    stored = hdr.parse_manifest(record[0]) if record else None
    if stored is None:
        return None
    with _manifest_memo_lock:
        _remember_manifest(manifest_key, stored)
    for variant in stored["variants"]:
        if hdr.variant_matches(variant, dirs):
            return variant
    return None


def _remember_manifest(manifest_key: bytes, manifest: dict[str, Any]) -> None:
    # Caller holds _manifest_memo_lock. Bounded like every other per-process memo here.
    remember(_manifest_memo, manifest_key, manifest, 4096)


def _store_manifest(cache: ProgramCacheResource, manifest_key: bytes, variant: dict[str, Any]) -> None:
    # Read-modify-write of the manifest: callers hold the single-flight lock of this source,
    # which serialises it against every thread and process sharing the cache directory.
    record = _get(cache, manifest_key)
    manifest = hdr.add_variant(hdr.parse_manifest(record[0]) if record else None, variant)
    import json

    raw = json.dumps(manifest, separators=(",", ":")).encode()
    _set(cache, manifest_key, raw, {"kind": "manifest"}, internal=True)
    with _manifest_memo_lock:
        _remember_manifest(manifest_key, manifest)


def _tracks_headers(options: Any) -> bool:
    return any(_is_set(getattr(options, f, None)) for f, p in OPTION_POLICY.items() if p == TRACKED)


_base_memo: dict[Any, tuple[list[tuple[str, bytes]], bytes, bytes]] = {}


class _Lookup:
    """One call's key material, computed once: base components, manifest key, toolchain."""

    def __init__(
        self,
        cache: ProgramCacheResource,
        code: str | bytes,
        code_type: str,
        target_type: str,
        options: Any,
        name_expressions: Sequence[str | bytes],
        extra_digest: bytes | None,
    ) -> None:
        self.cache = cache
        self.options = options
        self.code_type = code_type.lower() if isinstance(code_type, str) else code_type
        self.target_type = target_type.lower() if isinstance(target_type, str) else target_type
        self.toolchain = toolchain_for(self.code_type) if self.code_type in ("c++", "ptx", "nvvm") else None
        # Header tracking for every C++ compile without an extra_digest: even with no
        # include_path, NVRTC reads quoted includes from the current directory.
        self.track = self.code_type == "c++" and extra_digest is None
        if self.track and _trace_unsupported and _tracks_headers(options):
            raise ValueError(
                "this NVRTC cannot report which headers a compile reads (no -fdevice-time-trace), so "
                "include_path/pre_include need extra_digest=<bytes that change when the headers change>"
            )
        # The key material of a repeated call is memoised by the call's own arguments (the
        # options by their values: a mutated ProgramOptions is a new memo key).
        fingerprint = options_fingerprint(options)
        memo_key: Any = None
        if fingerprint is not None and type(code) in (str, bytes):
            names = tuple(name_expressions)
            memo_key = (code, code_type, target_type, fingerprint, names, extra_digest)
            try:
                found = _base_memo.get(memo_key)
            except TypeError:  # an unhashable name expression: no memo
                memo_key, found = None, None
            if found is not None:
                self.base, self.manifest_key, self.entry_key = found
                return
        self.base = key_components(
            code=code,
            code_type=code_type,
            options=options,
            target_type=target_type,
            name_expressions=name_expressions,
            extra_digest=extra_digest,
            headers_tracked=self.track,
            toolchain=self.toolchain,
        )
        # Tracked: the entry key depends on the headers, found through the manifest.
        # Untracked: no manifest; the entry key is known now.
        self.manifest_key = _manifest_key(self.base) if self.track else b""
        self.entry_key = b"" if self.track else digest_components(self.base)
        if memo_key is not None:
            remember(_base_memo, memo_key, (self.base, self.manifest_key, self.entry_key), 4096)

    def find(self) -> tuple[bytes, tuple[bytes, Meta] | None, dict[str, Any] | None]:
        """(key, record or None, header variant or None); key is b"" when no variant matches."""
        if not self.track:
            return self.entry_key, _get(self.cache, self.entry_key, counted=False), None
        variant = _matching_variant(self.cache, self.manifest_key, hdr.search_dirs(self.options), True)
        if variant is None:
            return b"", None, None
        key = _full_key(self.base, variant, self.manifest_key)
        return key, _get(self.cache, key, counted=False), variant


def probe(
    code: str | bytes,
    code_type: str = "c++",
    target_type: str = "cubin",
    *,
    options: ProgramOptions | None = None,
    cache: ProgramCacheResource | None = None,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | None = None,
) -> CompileInfo:
    """Would compile_program hit? Looks up without compiling, storing or counting."""
    if options is None:
        from kernelcache.keys import _default_options

        options = _default_options()
    look = _Lookup(cache or default_cache(), code, code_type, target_type, options, name_expressions, extra_digest)
    key, record, variant = look.find()
    info = CompileInfo(hit=record is not None, key=key)
    if variant is not None:
        info.headers = hdr.tracked_paths(variant, hdr.search_dirs(options))
    return info


# -- the public call ------------------------------------------------------------------------


def compile_program(
    code: str | bytes,
    code_type: str = "c++",
    target_type: str = "cubin",
    *,
    options: ProgramOptions | None = None,
    cache: ProgramCacheResource | None = None,
    name_expressions: Sequence[str | bytes] = (),
    logs: Any = None,
    extra_digest: bytes | None = None,
    info: CompileInfo | None = None,
    wait_timeout: float | None = None,
) -> ObjectCode:
    """Compile ``code`` once; later calls (any thread, process, or run) load the stored result.

    ``cache``: a ProgramCacheResource (default: the FileStreamProgramCache at
    ``KERNELCACHE_DIR`` or the platformdirs user cache; ``KERNELCACHE_DISABLE=1`` compiles
    without any cache). On a hit no compiler runs and the returned ObjectCode carries the
    original's symbol mapping; ``logs.write`` receives the original compile log on hits
    too. Pass ``info=CompileInfo()`` to learn whether it was a hit, the key and timings.

    Concurrent callers of one key wait for a single compile (``wait_timeout`` seconds at
    most, default ``KERNELCACHE_WAIT_TIMEOUT`` or 600; then they compile on their own).
    Compile errors propagate as cuda.core raises them; nothing is stored for them. A
    failing cache (I/O error, corrupt entry, full disk) degrades to a recompile and warns.
    """
    start = time.perf_counter()
    want_headers = info is not None  # the list of tracked headers is built only when asked for
    info = info if info is not None else CompileInfo()
    if options is None:
        from kernelcache.keys import _default_options

        options = _default_options()
    if config.disabled():
        obj, log_text, seconds = _run_compiler(code, code_type, target_type, options, name_expressions, None)
        _emit_log(logs, log_text)
        info.hit, info.cached, info.compile_seconds = False, False, seconds
        info.seconds = time.perf_counter() - start
        return obj
    if cache is None:
        cache = default_cache()
    elif not isinstance(cache, ProgramCacheResource):
        raise TypeError(f"cache must be a ProgramCacheResource or None, not {type(cache).__name__}")

    look = _Lookup(cache, code, code_type, target_type, options, name_expressions, extra_digest)
    key, record, variant = look.find()
    info.lookup_seconds = time.perf_counter() - start
    if record is None:
        # Single flight per source (C++: per source+options, since the header-complete key
        # is only known after the compile; others: per key). Threads and processes of this
        # host meet on a file lock; hosts sharing a Redis tier meet on a Redis lock.
        flight_key = look.manifest_key or look.entry_key
        budget = config.wait_timeout_s() if wait_timeout is None else wait_timeout
        deadline = time.monotonic() + budget
        with single_flight(flight_key, _lock_path(cache, flight_key), budget) as outcome:
            if outcome == "acquired":
                key, record, variant = look.find()  # a peer may have compiled it meanwhile
                info.waited = record is not None
            remote_lock = getattr(cache, "remote_lock", None)
            if record is None and remote_lock is not None:
                with remote_lock(flight_key.hex(), deadline, lambda: look.find()[1] is not None) as remote:
                    if remote in ("acquired", "ready"):
                        key, record, variant = look.find()  # published by another host?
                        info.waited = info.waited or record is not None
                    if record is None:
                        return _miss(look, code, options, name_expressions, logs, info, start)
            elif record is None:
                return _miss(look, code, options, name_expressions, logs, info, start)
    payload, meta = record
    _emit_log(logs, meta.get("log", ""))
    saved = float(meta.get("compile_seconds", 0.0))
    _count(cache, hits=1, bytes_read=len(payload), compile_us_saved=int(saved * 1e6))
    info.hit, info.key, info.compile_seconds = True, key, saved
    if want_headers and variant and variant["headers"]:
        info.headers = hdr.tracked_paths(variant, hdr.search_dirs(options))
    obj = _object_from_bytes(payload, look.target_type, options.name or "", meta)
    info.seconds = time.perf_counter() - start
    return obj


def _emit_log(logs: Any, text: str) -> None:
    if logs is not None and text:
        logs.write(text)


def _miss(
    look: _Lookup,
    code: str | bytes,
    options: Any,
    name_expressions: Sequence[str | bytes],
    logs: Any,
    info: CompileInfo,
    start: float,
) -> ObjectCode:
    global _trace_unsupported
    cache, code_type, target_type, track = look.cache, look.code_type, look.target_type, look.track
    trace_dir = tempfile.mkdtemp(prefix="kernelcache-trace-") if track else None
    cwd = os.getcwd()
    try:
        trace_path = os.path.join(trace_dir, "trace") if trace_dir else None
        _count(cache, misses=1)  # counted first: a compile that fails is still this call's miss
        try:
            obj, log_text, seconds = _run_compiler(code, code_type, target_type, options, name_expressions, trace_path)
        except Exception:
            if trace_path is not None:
                _reset_nvrtc_trace_state(trace_dir)
            raise
        _count(cache, compiles=1)
        _emit_log(logs, log_text)
        info.hit, info.compile_seconds = False, seconds
        variant = None
        if track:
            assert trace_path is not None
            found = hdr.headers_from_trace(trace_path, cwd)
            if found is None:
                _trace_unsupported = True
                if _tracks_headers(options):
                    _warn_store(cache, "track headers", RuntimeError("NVRTC wrote no header trace"))
                    info.cached = False
                    return obj  # cannot be keyed safely: not stored
                found = []
            dirs = hdr.search_dirs(options, cwd)
            variant = hdr.make_variant(found, dirs, hdr.toolchain_header_roots(options))
            key = _full_key(look.base, variant)
            info.headers = hdr.tracked_paths(variant, dirs)
        else:
            key = look.entry_key
        info.key = key
        meta = {
            "code_type": code_type,
            "target_type": target_type,
            "name": options.name or "",
            "symbols": _encode_symbols(getattr(obj, "symbol_mapping", None)),
            "log": log_text,
            "compile_seconds": seconds,
            "toolchain": look.toolchain.as_dict() if look.toolchain is not None else {},
            "options": _options_summary(options),
            "headers": info.headers,
            "kernels": _kernel_names(code, getattr(obj, "symbol_mapping", None)),
        }
        stored_at = time.perf_counter()
        _set(cache, key, as_value_bytes(obj), meta)
        if variant is not None:
            _store_manifest(cache, look.manifest_key, variant)
        info.store_seconds = time.perf_counter() - stored_at
        info.seconds = time.perf_counter() - start
        return obj
    finally:
        if trace_dir:
            shutil.rmtree(trace_dir, ignore_errors=True)
