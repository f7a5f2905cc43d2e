"""compile_program(): key -> store.get -> single-flight compile -> store.set; logs and symbols replayed.

On a hit no compiler runs: the stored bytes come back as an ObjectCode of the right kind,
with the NVRTC symbol mapping (name expressions) and the compile log of the original miss.
For C++ the key also covers every header the compile read (see manifests.py, headers.py).
This module is the flow alone: the look-up (key material, the record found) is lookup.py, the
compilers run in compilers.py, what is stored beside an artifact is records.py, header
manifests are manifests.py, the default store default_store.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache.compile.compilers import (
    lost_trace,
    new_trace_path,
    remove_trace,
    reset_nvrtc_trace_state,
    run_compiler,
)
from kernelcache.compile.flight import single_flight
from kernelcache.compile.lookup import Lookup
from kernelcache.compile.metadata import (
    artifact_meta,
    count,
    object_from_record,
    refuse_to_store,
    write_record,
)
from kernelcache.headers import digests as hdr
from kernelcache.headers import manifests, variants
from kernelcache.headers import scan as includes
from kernelcache.keys.derive import default_options
from kernelcache.log import key_prefix, logger
from kernelcache.stores.base import Meta, ProgramCacheResource, as_value_bytes
from kernelcache.stores.default import default_cache, default_cache_or_none
from kernelcache.stores.foreign import as_store
from kernelcache.stores.naming import entry_name

if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions

__all__ = ["CompileInfo", "compile_program", "probe"]


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

    @property
    def entry_name(self) -> str:
        """The entry's name in a store (what ``kernelcache ls`` prints a prefix of)."""
        return entry_name(self.key) if self.key else ""


def _lock_path(cache: ProgramCacheResource, key: bytes) -> str | None:
    try:
        return cache.lock_path(key.hex() + ".lock")
    except OSError:
        return None  # locks/ cannot be made: threads of this process still meet


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
    options = default_options() if options is None else options
    store = as_store(cache) if cache is not None else default_cache()
    look = Lookup(store, code, code_type, target_type, options, name_expressions, extra_digest)
    key, record, variant = look.find()
    info = CompileInfo(hit=record is not None, key=key)
    if variant is not None:
        info.headers = variants.tracked_paths(variant, hdr.search_dirs(options))
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
    options = default_options() if options is None else options
    store = None if config.disabled() else _resolve_cache(cache)
    if store is None:
        obj, log_text, seconds = run_compiler(code, code_type, target_type, options, name_expressions, None)
        _emit_log(logs, log_text)
        info.hit, info.cached, info.compile_seconds = False, False, seconds
        info.seconds = time.perf_counter() - start
        return obj
    cache = store
    look = Lookup(cache, code, code_type, target_type, options, name_expressions, extra_digest)
    key, record, variant = look.find()
    info.lookup_seconds = time.perf_counter() - start
    if record is not None:
        return _hit(look, key, record, variant, logs, info, start, want_headers)
    budget = config.wait_timeout_s() if wait_timeout is None else _checked_wait(wait_timeout)
    obj = _flight(look, code, name_expressions, logs, info, start, budget, want_headers)
    assert obj is not None  # only wait=False returns None
    return obj


def _checked_wait(value: object) -> float:
    """``wait_timeout`` as seconds; ValueError for what no lock wait can take (NaN, inf, < 0, huge)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= config.MAX_WAIT_S:
        raise ValueError(
            f"wait_timeout must be a number of seconds from 0 to {config.MAX_WAIT_S:g} or None, not {value!r}"
        )
    return float(value)


def _resolve_cache(cache: ProgramCacheResource | None) -> ProgramCacheResource | None:
    """The store a call uses: ``cache``, or the default one; TypeError for anything else.

    None when the default store cannot be opened (see default_store.default_cache_or_none):
    such a call compiles uncached.
    """
    if cache is None:
        return default_cache_or_none()
    return as_store(cache)  # a cuda.core store is wrapped: metadata under derived keys


def _flight(
    look: Lookup,
    code: str | bytes,
    name_expressions: Sequence[str | bytes],
    logs: Any,
    info: CompileInfo,
    start: float,
    budget: float,
    want_headers: bool,
    wait: bool = True,
) -> ObjectCode | None:
    """A missing key under its single flight: the peer's result if one published it
    meanwhile, else our compile. ``wait=False``: one try; None if a peer holds the key."""
    # Single flight per source (C++: per source+options, since the header-complete key
    # is only known after the compile; others: per key). Threads and processes of this
    # host meet on a file lock; hosts sharing a Redis tier meet on a Redis lock.
    cache, options = look.cache, look.options
    flight_key = look.manifest_key or look.entry_key
    deadline = time.monotonic() + (budget if wait else 0.0)
    key, record, variant = b"", None, None
    lock_path = _lock_path(cache, flight_key)
    with single_flight(flight_key, lock_path, budget, wait=wait) as outcome:
        if outcome == "busy":
            return None
        if outcome == "acquired":
            key, record, variant = look.find()  # a peer may have compiled it meanwhile
            info.waited = record is not None
        if record is None and cache.has_remote_lock:
            # The Redis lock is taken inside the file lock and released before it: so a
            # Redis lock held under the file lock we hold now was left by a dead holder
            # of this host, and the Redis tier takes it over at once (stores/redislock).
            held = lock_path if outcome == "acquired" else None
            ready = lambda: look.find()[1] is not None  # noqa: E731
            with cache.remote_lock(flight_key.hex(), deadline, ready, local_lock=held) as remote:
                if remote == "timeout" and not wait:
                    return None  # another host is compiling it: come back to it later
                if remote in ("acquired", "ready"):
                    key, record, variant = look.find()  # published by another host?
                    info.waited = info.waited or record is not None
                if record is None:
                    return _miss(look, code, options, name_expressions, logs, info, start)
        elif record is None:
            return _miss(look, code, options, name_expressions, logs, info, start)
    return _hit(look, key, record, variant, logs, info, start, want_headers)


def _hit(
    look: Lookup,
    key: bytes,
    record: tuple[bytes, Meta],
    variant: dict[str, Any] | None,
    logs: Any,
    info: CompileInfo,
    start: float,
    want_headers: bool,
) -> ObjectCode:
    """The ObjectCode of a stored record, counted as a hit (log and symbols replayed)."""
    payload, meta = record
    _emit_log(logs, meta.get("log", ""))
    saved = float(meta.get("compile_seconds", 0.0))
    count(look.cache, hits=1, bytes_read=len(payload), compile_us_saved=int(saved * 1e6))
    info.hit, info.key, info.compile_seconds = True, key, saved
    if want_headers and variant and variant["headers"]:
        info.headers = variants.tracked_paths(variant, hdr.search_dirs(look.options))
    obj = object_from_record(payload, look.target_type, look.options.name or "", meta)
    info.seconds = time.perf_counter() - start
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "hit %s lookup %.3f ms total %.3f ms (saves a %.3f s compile)%s",
            key_prefix(key),
            info.lookup_seconds * 1e3,
            info.seconds * 1e3,
            saved,
            " after waiting for a peer" if info.waited else "",
        )
    return obj


def _emit_log(logs: Any, text: str) -> None:
    if logs is not None and text:
        logs.write(text)


def _miss(
    look: Lookup,
    code: str | bytes,
    options: Any,
    name_expressions: Sequence[str | bytes],
    logs: Any,
    info: CompileInfo,
    start: float,
) -> ObjectCode:
    cache, code_type, target_type, track = look.cache, look.code_type, look.target_type, look.track
    count(cache, misses=1)  # counted first: a compile that fails is still this call's miss
    tmp_dir = cache.tmp_dir
    trace_path = new_trace_path(tmp_dir) if track else None
    not_stored = ""  # why this compile's result cannot be stored, when it cannot
    if track and trace_path is None:
        not_stored = "there is no room for NVRTC's header trace (a full disk would abort NVRTC)"
    cwd = os.getcwd()
    dirs = hdr.search_dirs(options, cwd) if track else []
    before = manifests.digests_before(look.manifest_key, dirs) if track else {}
    started_ns = hdr.now_ns()  # the clock files are stamped with
    try:
        try:
            obj, log_text, seconds = run_compiler(code, code_type, target_type, options, name_expressions, trace_path)
        except Exception as exc:
            if trace_path is None:
                raise
            reset_nvrtc_trace_state(tmp_dir)
            if not lost_trace(exc, trace_path):
                raise
            # The trace, not the source, failed the compile (ptxas found it gone or
            # rewritten): the compile without a trace is the caller's, not stored.
            not_stored = f"NVRTC lost its header trace ({str(exc).strip().splitlines()[-1]})"
            remove_trace(trace_path)
            trace_path = None
            obj, log_text, seconds = run_compiler(code, code_type, target_type, options, name_expressions, None)
        count(cache, compiles=1)
        _emit_log(logs, log_text)
        info.hit, info.compile_seconds = False, seconds
        variant = None
        if track and not not_stored:
            assert trace_path is not None
            found = hdr.headers_from_trace(trace_path, cwd)
            if found is None:
                not_stored = "NVRTC wrote no usable header trace"
            else:
                variant, changed = variants.build_variant(
                    found,
                    dirs,
                    hdr.first_include(options),
                    hdr.toolchain_header_roots(options),
                    _source_bytes(code),
                    includes.pre_includes(options),
                    started_ns,
                    before,
                    includes.option_macros(options),
                )
                if changed:
                    not_stored = "a header changed during the compile: " + ", ".join(changed[:3])
        if not_stored:
            refuse_to_store(cache, not_stored)
            info.cached = False
            info.seconds = time.perf_counter() - start
            return obj
        if variant is not None:
            key = manifests.full_key(look.base, variant)
            info.headers = variants.tracked_paths(variant, dirs)
        else:
            key = look.entry_key
        info.key = key
        meta = artifact_meta(
            code, code_type, target_type, options, obj, log_text, seconds, look.toolchain, info.headers
        )
        stored_at = time.perf_counter()
        write_record(cache, key, as_value_bytes(obj), meta)
        if variant is not None:
            manifests.store_manifest(cache, look.manifest_key, variant)
        info.store_seconds = time.perf_counter() - stored_at
        info.seconds = time.perf_counter() - start
        if logger.isEnabledFor(logging.INFO):
            prefix = key_prefix(key)
            logger.debug("miss %s lookup %.3f ms", prefix, info.lookup_seconds * 1e3)
            logger.info(
                "compiled %s (%s -> %s, %s) in %.3f s, stored in %.3f ms",
                prefix,
                code_type,
                target_type,
                getattr(options, "arch", None) or "default arch",
                seconds,
                info.store_seconds * 1e3,
            )
        return obj
    finally:
        if trace_path is not None:
            remove_trace(trace_path)


def _source_bytes(code: str | bytes) -> bytes:
    return code.encode("utf-8", "surrogatepass") if isinstance(code, str) else bytes(code)
