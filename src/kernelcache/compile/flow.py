"""compile_program() and probe(): one call's flow, in short steps.

look up -> hit: replay the stored record (log, symbols); no compiler runs
        -> miss: single flight -> a peer's result, or our compile -> store

The request is compile.request, the look-up (key material, the record found) compile.lookup,
single flight compile.flight, the header trace of a miss compile.tracing, where and how the
compiler runs kernelcache.runners, what is stored beside an artifact compile.metadata. For C++ the key also
covers every header the compile read (headers.manifests).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache.compile.lookup import Found, Lookup
from kernelcache.compile.metadata import object_from_record
from kernelcache.compile.request import CompileRequest
from kernelcache.keys.program_name import compiled_name
from kernelcache.log import DEBUG, INFO, logger
from kernelcache.stores.base import ProgramCacheResource, as_value_bytes
from kernelcache.stores.cuda_core import as_store
from kernelcache.stores.naming import entry_name, key_prefix
from kernelcache.stores.safe import count

# What only a miss, a tracked header variant, KERNELCACHE_RECORD or the default store needs is
# imported where it is used: a fresh process's hit from a given store loads none of it.
if TYPE_CHECKING:
    from cuda.core import ObjectCode, ProgramOptions

    from kernelcache.compile.flight import SingleFlight
    from kernelcache.compile.strict import MissBooks
    from kernelcache.compile.tracing import HeaderTrace

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
    cached: bool = True  # False: KERNELCACHE_DISABLE=1, no usable store, or the result was not stored
    headers: list[str] = dataclasses.field(default_factory=list)  # headers the key covers
    miss_reason: str | None = None  # on a miss: the nearest entry of this source and what differs
    not_stored: str = ""  # a compile returned but not stored: why (cached is then False)
    header_pass: bool = False  # on a C++ miss: NVRTC's header pass ran (else an earlier one's headers held)

    @property
    def key_hex(self) -> str:
        return self.key.hex()

    @property
    def entry_name(self) -> str:
        """The entry's name in a store (what ``kernelcache ls`` prints a prefix of)."""
        return entry_name(self.key) if self.key else ""


class Call:
    """Where one call reports: its CompileInfo, its ``logs`` sink, when it started."""

    __slots__ = ("info", "logs", "processes", "remote", "start", "want_headers")

    def __init__(
        self,
        info: CompileInfo,
        logs: Any = None,
        want_headers: bool = False,
        processes: bool = False,
        remote: Any = None,
    ) -> None:
        if logs is not None and not callable(getattr(logs, "write", None)):
            raise TypeError(
                f"logs must have a write(str) method (a file, io.StringIO, sys.stderr) or be None, "
                f"not {type(logs).__name__}"
            )
        self.info = info
        self.logs = logs
        self.start = time.perf_counter()
        self.want_headers = want_headers  # the list of tracked headers is built only when asked for
        self.processes = processes  # its compile may run in a worker process (compile_many's choice)
        self.remote = remote  # a runner its C++ compile goes to (warm --executor: runners.remote)

    def emit_log(self, text: str) -> None:
        if self.logs is not None and text:
            self.logs.write(text)

    def done(self) -> None:
        self.info.seconds = time.perf_counter() - self.start


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
    request = CompileRequest.of(code, code_type, target_type, options, name_expressions, extra_digest)
    if cache is not None:
        store = as_store(cache)
    else:
        from kernelcache.stores.default import default_cache

        store = default_cache()
    key, record, variant = Lookup(store, request).find()
    info = CompileInfo(hit=record is not None, key=key)
    if variant is not None:
        from kernelcache.headers import digests as hdr
        from kernelcache.headers import scan as includes
        from kernelcache.headers import variants

        info.headers = includes.as_shown(variants.tracked_paths(variant, hdr.search_dirs(request.options)))
    return info


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
    call = Call(info if info is not None else CompileInfo(), logs, want_headers=info is not None)
    budget = None if wait_timeout is None else _checked_wait(wait_timeout)
    request = CompileRequest.of(code, code_type, target_type, options, name_expressions, extra_digest)
    plain = config.call_flags_unset()  # none of DISABLE, RECORD, RECACHE set (read per call): none asked
    store = None if not plain and config.disabled() else resolve_cache(cache)
    if store is None:
        return compile_uncached(request, call)
    look = Lookup(store, request)
    if not plain:
        _record(request)  # KERNELCACHE_RECORD: hits and misses
    found = look.find()
    call.info.lookup_seconds = time.perf_counter() - call.start
    recache = not plain and found[1] is not None and config.recache()  # compile, store, replace what is there
    if found[1] is not None and not recache:
        return replay_hit(look, found, call)
    from kernelcache.compile.flight import SingleFlight

    obj = fly(look, call, SingleFlight.for_store(store, look.flight_key, budget), recache=recache)
    assert obj is not None  # only try_hold can leave the key to a peer
    return obj


def _record(request: CompileRequest) -> None:
    """lockfile.record(request), importing lockfile only where KERNELCACHE_RECORD is set."""
    if config.record_path() is not None:
        from kernelcache.compile import lockfile

        lockfile.record(request)


def _checked_wait(value: object) -> float:
    """``wait_timeout`` as seconds (math.inf: forever); ValueError for what no lock wait can take (NaN, < 0, huge)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not config.is_wait_s(value):
        raise ValueError(
            f"wait_timeout must be a number of seconds from 0 to {config.MAX_WAIT_S:g}, math.inf (wait forever) "
            f"or None, not {value!r}"
        )
    return float(value)


def resolve_cache(cache: ProgramCacheResource | None) -> ProgramCacheResource | None:
    """The store a call uses: ``cache``, or the default one; TypeError for anything else.

    None when the default store cannot be opened (stores.default.default_cache_or_none):
    such a call compiles uncached.
    """
    if cache is None:
        from kernelcache.stores.default import default_cache_or_none

        return default_cache_or_none()
    return as_store(cache)  # a cuda.core store is wrapped: metadata under derived keys


def compile_uncached(request: CompileRequest, call: Call) -> ObjectCode:
    """The compile of a call that has no cache to use (disabled, or none could be opened)."""
    from kernelcache.compile import strict
    from kernelcache.runners.choice import runner_for

    _record(request)
    call.info.miss_reason = strict.on_uncached(config.disabled())  # KERNELCACHE_REQUIRE_HIT=1 raises here
    obj, log_text, seconds = runner_for(request, call.processes, call.remote).run_compiler(request, None)
    call.emit_log(log_text)
    call.info.hit, call.info.cached, call.info.compile_seconds = False, False, seconds
    call.info.not_stored = call.info.miss_reason
    call.done()
    return obj


def fly(
    look: Lookup, call: Call, flight: SingleFlight, *, wait: bool = True, recache: bool = False
) -> ObjectCode | None:
    """A missing key under its single flight: the peer's result if one published it
    meanwhile, else our compile. ``wait=False``: one try; None if a peer holds the key.
    ``recache``: compile even if it is stored (KERNELCACHE_RECACHE), and replace it."""
    from kernelcache.compile.flight import BUSY, READY

    latest: list[Found] = []

    def ready() -> bool:  # asked by the flight after each lock it takes
        if recache:
            return False
        latest.append(look.find())
        return latest[-1][1] is not None

    with flight.hold(ready) if wait else flight.try_hold(ready) as outcome:
        if outcome == BUSY:
            return None
        if outcome != READY:
            return compile_miss(look, call)  # the locks stay held until it is stored
    call.info.waited = True
    return replay_hit(look, latest[-1], call)


def replay_hit(look: Lookup, found: Found, call: Call) -> ObjectCode:
    """The ObjectCode of a stored record, counted as a hit (log and symbols replayed)."""
    key, record, variant = found
    assert record is not None
    payload, meta = record
    info, options = call.info, look.request.options
    call.emit_log(meta.get("log", ""))
    saved = float(meta.get("compile_seconds", 0.0))
    count(look.cache, hits=1, bytes_read=len(payload), compile_us_saved=int(saved * 1e6))
    info.hit, info.key, info.compile_seconds = True, key, saved
    if call.want_headers and variant and variant["headers"]:
        from kernelcache.headers import digests as hdr
        from kernelcache.headers import scan as includes
        from kernelcache.headers import variants

        info.headers = includes.as_shown(variants.tracked_paths(variant, hdr.search_dirs(options)))
    obj = object_from_record(payload, look.request.target_type, compiled_name(options, look.request.code_type), meta)
    call.done()
    if logger.isEnabledFor(DEBUG):
        logger.debug(
            "hit %s lookup %.3f ms total %.3f ms (saves a %.3f s compile)%s",
            key_prefix(key),
            info.lookup_seconds * 1e3,
            info.seconds * 1e3,
            saved,
            " after waiting for a peer" if info.waited else "",
        )
    return obj


def compile_miss(look: Lookup, call: Call) -> ObjectCode:
    """Compile, then store the result under its key (with the header variant it read), or
    return it unstored when the headers cannot be vouched for (compile.tracing)."""
    from kernelcache.compile import strict
    from kernelcache.compile.metadata import refuse_to_store
    from kernelcache.compile.tracing import HeaderTrace
    from kernelcache.keys import basedir

    cache = look.cache
    books = strict.MissBooks(look)  # counted and explained beside the compile; REQUIRE_HIT=1 raises here
    compiler = look.toolchain.compiler if look.toolchain is not None else ""
    trace: HeaderTrace | None = None
    try:
        trace = HeaderTrace(look.request, look.manifest_key, cache, compiler) if look.track else None
        obj, log_text, seconds = _compile(look.request, trace, call, books.start)
        count(cache, compiles=1)
        call.emit_log(log_text)
        call.info.hit, call.info.compile_seconds = False, seconds
        call.info.miss_reason = books.reason()
        variant = trace.variant() if trace is not None else None
        request = look.request
        not_stored = (
            _compiled_by_another(look)
            or (trace.not_stored if trace is not None else "")
            or basedir.unshareable(request.options, request.code_type, request.target_type, as_value_bytes(obj))
        )
        if not_stored:
            refuse_to_store(cache, not_stored)
            call.info.cached, call.info.not_stored = False, not_stored
            call.done()
            return obj
        _store(look, call, obj, log_text, seconds, variant, trace.dirs if trace is not None else [], books)
        return obj
    finally:
        try:
            books.close()  # nothing beside the compile outlives the call
            call.info.miss_reason = books.reason()
        finally:
            if trace is not None:
                trace.remove()


def _compiled_by_another(look: Lookup) -> str:
    """Why not to store a compile whose key named another compiler build than the one that ran
    (keys.toolchain.confirm: a library that cuda.pathfinder loaded from elsewhere than foreseen)."""
    if look.toolchain is None:
        return ""
    from kernelcache.keys import toolchain

    return toolchain.confirm(look.request.code_type, look.toolchain.compiler)


def _compile(
    request: CompileRequest, trace: HeaderTrace | None, call: Call, started: Callable[[], None]
) -> tuple[ObjectCode, str, float]:
    """The plain compile, then its header pass (compilers.header_pass) when headers are tracked,
    unless an earlier pass of the same preprocessing still holds (compile.tracing). Here, in a
    worker process (runners.choice; restrict=True: never here) or an executor's. ``started``:
    called right before the compiler takes over (work beside the compile begins then)."""
    from kernelcache.runners.choice import IN_PROCESS, IN_WORKERS, run_header_pass, runner_for

    runner = runner_for(request, call.processes, call.remote)
    if trace is None:
        return runner.run_compiler(request, None, started=started)
    if runner not in (IN_PROCESS, IN_WORKERS) or not trace.build_known():
        call.info.header_pass = trace.path is not None
        return runner.run_compiler(request, trace.path, trace.prepare, started=started)
    try:
        result = runner.run_compiler(request, None, started=lambda: (started(), trace.start_known()))
    finally:
        holds = trace.known_holds()  # joined on a failed compile too: nothing of the call outlives it
    if not holds:
        assert trace.path is not None  # build_known starts nothing without a trace path
        call.info.header_pass = True
        run_header_pass(runner, request, trace.path)
    return result


def _store(
    look: Lookup,
    call: Call,
    obj: ObjectCode,
    log_text: str,
    seconds: float,
    variant: dict[str, Any] | None,
    dirs: list[str],
    books: MissBooks,
) -> None:
    """Write the record (and the header manifest naming its variant); log the compile."""
    from kernelcache.compile.metadata import artifact_meta
    from kernelcache.headers import manifests, variants
    from kernelcache.headers import scan as includes
    from kernelcache.stores.safe import write_record

    info, request = call.info, look.request
    if variant is not None:
        key = manifests.full_key(look.base, variant)
        info.headers = includes.as_shown(variants.tracked_paths(variant, dirs))
    else:
        key = look.entry_key
    info.key = key
    meta = artifact_meta(request, obj, log_text, seconds, look.toolchain, info.headers)
    stored_at = time.perf_counter()
    written = write_record(look.cache, key, as_value_bytes(obj), meta)
    if not written:  # it warned (or the store is read-only)
        info.cached, info.not_stored = False, "the cache did not take the write (see the warning above)"
    if variant is not None:
        manifests.store_manifest(look.cache, look.manifest_key, variant)
    if written:  # the source index explains later misses: it names only entries that were stored
        books.stored(key)
    info.store_seconds = time.perf_counter() - stored_at
    call.done()
    if logger.isEnabledFor(INFO):
        prefix = key_prefix(key)
        logger.debug("miss %s lookup %.3f ms", prefix, info.lookup_seconds * 1e3)
        logger.info(
            "compiled %s (%s -> %s, %s) in %.3f s, stored in %.3f ms",
            prefix,
            request.code_type,
            request.target_type,
            getattr(request.options, "arch", None) or "default arch",
            seconds,
            info.store_seconds * 1e3,
        )
