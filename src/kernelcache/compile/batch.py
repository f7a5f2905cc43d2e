"""compile_many(): many compile_program calls at once -- hits first, misses on threads, peers' keys last.

The order of work, and why:
1. Every request is looked up first, in this thread: a hit costs microseconds, and an
   all-hit batch starts no thread at all.
2. The misses, one source at a time (_sources_apart), go to up to ``max_workers`` threads
   (NVRTC, nvJitLink and NVVM release the GIL, so compiles on threads run on all cores). A
   thread takes a key's single-flight lock only if nobody holds it (one non-blocking try);
   a key that a peer -- another thread, another process sharing the directory, another host
   sharing a Redis tier -- is compiling is put aside. So P processes given the same K requests split the K compiles
   between them instead of queueing behind each other on the same key.
3. Only when no fresh key is left does a thread come back to the keys put aside, trying
   each again every few milliseconds: a key is taken the moment its peer releases it,
   which is right after it published the entry, so the waiter finds a hit. A peer that
   died released its lock with its life (flock), and the waiter compiles the key itself.
   A peer that holds a key longer than the wait budget (``KERNELCACHE_WAIT_TIMEOUT``) is
   given up on, as compile_program does: the key is compiled without the lock.

Failures: a request that fails does not stop the others. When every other request has
finished (and was stored), CompileManyError is raised; it carries each failure by
request index and every result (None where failed).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache.compile import lockfile
from kernelcache.compile.flight import SingleFlight
from kernelcache.compile.flow import Call, CompileInfo, compile_uncached, fly, replay_hit, resolve_cache
from kernelcache.compile.lookup import Lookup
from kernelcache.compile.request import CompileRequest
from kernelcache.runners import slots
from kernelcache.runners.choice import batch_threads, batch_uses_processes
from kernelcache.runners.pool import pool as workers_pool

if TYPE_CHECKING:
    from cuda.core import ObjectCode

    from kernelcache.stores.base import ProgramCacheResource

__all__ = ["CompileManyError", "compile_many"]

REQUEST_FIELDS = frozenset({"code", "code_type", "target_type", "options", "name_expressions", "extra_digest"})
_RETRY_S = 0.005  # how often a key that a peer holds is tried again (a try costs ~20 us)
SETTLE_S = 0.02  # a helper's first look at the node: processes started together have all joined by then
FLEET_WAIT_S = 1.0  # with other batches on the node, a helper starts a worker only for a batch this long


class CompileManyError(Exception):
    """Some requests of a batch failed; every other request finished and was stored.

    ``errors``: request index -> the exception that request raised (the same one
    compile_program would have raised). ``results``: one entry per request, in request
    order: the result, or None where the request failed.
    """

    def __init__(self, errors: dict[int, BaseException], results: list[Any]) -> None:
        self.errors = dict(sorted(errors.items()))
        self.results = list(results)
        lines = [f"{len(self.errors)} of {len(self.results)} requests failed (see .errors and .results):"]
        for index, exc in list(self.errors.items())[:5]:
            text = str(exc).strip()
            lines.append(f"  request #{index}: {type(exc).__name__}: {text.splitlines()[0] if text else ''}")
        if len(self.errors) > 5:
            lines.append(f"  ... and {len(self.errors) - 5} more")
        super().__init__("\n".join(lines))

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes despite the custom __init__
        return (type(self), (self.errors, self.results))


def normalize_requests(
    requests: Iterable[Mapping[str, Any]], fields: frozenset[str], what: str
) -> list[dict[str, Any]]:
    """The requests as dicts; TypeError (naming the request) for anything malformed."""
    if isinstance(requests, (str, bytes, Mapping)):
        raise TypeError(f"{what}: requests must be a sequence of mappings, not one {type(requests).__name__}")
    if not isinstance(requests, Iterable):
        raise TypeError(
            f"{what}: requests must be a sequence of mappings (one per compile), not {type(requests).__name__}"
        )
    out = []
    for i, request in enumerate(requests):
        if not isinstance(request, Mapping):
            raise TypeError(f"{what}: request #{i} must be a mapping of arguments, not {type(request).__name__}")
        unknown = set(request) - fields
        if unknown:
            raise TypeError(f"{what}: request #{i} has unknown field(s) {sorted(unknown)}; known: {sorted(fields)}")
        missing = ({"code"} | ({"name"} & fields)) - set(request)
        if missing:
            raise TypeError(f"{what}: request #{i} needs {sorted(missing)}")
        out.append(dict(request))
    return out


def worker_count(max_workers: int | None) -> int:
    """``max_workers`` checked (None: the CPU count)."""
    if max_workers is None:
        return os.cpu_count() or 1
    if type(max_workers) is not int or max_workers < 1:
        raise ValueError(f"max_workers must be a positive int or None (the CPU count), not {max_workers!r}")
    return max_workers


class _Job:
    """One request that missed: retried until it is compiled here or found published."""

    __slots__ = ("index", "look", "request", "info", "retry_at", "give_up_at")

    def __init__(self, index: int, look: Lookup | None, request: CompileRequest) -> None:
        self.index = index
        self.look = look  # None: the cache is disabled; the request compiles uncached
        self.request = request
        self.info = CompileInfo()
        self.retry_at = 0.0  # monotonic time of the next try once a peer was found holding it
        self.give_up_at = 0.0  # set at the first "busy": the end of the wait budget


class _Batch:
    """The shared state of one batch: the queues, the results, the errors."""

    def __init__(self, jobs: list[_Job], size: int, budget: float, on_done: Callable[[int], object] | None) -> None:
        self.fresh = collections.deque(jobs)
        self.put_aside: collections.deque[_Job] = collections.deque()
        self.results: list[Any] = [None] * size  # distinct indexes: no two threads write one slot
        self.errors: dict[int, BaseException] = {}
        self.infos: list[CompileInfo | None] = [None] * size
        self.budget = budget
        self.processes = False  # misses compile in worker processes (runners.choice.batch_uses_processes)
        self.remote: Any = None  # a runner the C++ misses go to (warm --executor: runners.remote.OnExecutor)
        # The thread whose compiles stay in this process, if any (the default's choice: the
        # caller's thread needs no worker to start, and one thread of NVRTC runs unserialised).
        self.here: threading.Thread | None = None
        self.stop = False
        self.running = 0  # jobs taken by a thread and not yet finished or put aside
        self.done = threading.Event()  # the caller's thread found nothing left: helpers end
        self.began = time.monotonic()
        self.fleet: bool | None = None  # other batches ran on the node SETTLE_S in (help)
        self._on_done = on_done
        self._lock = threading.Condition()

    def finish(
        self, index: int, result: Any = None, info: CompileInfo | None = None, error: BaseException | None = None
    ) -> None:
        """Record one request's outcome (each index is finished once, by one thread)."""
        if error is not None:
            with self._lock:
                self.errors[index] = error
        else:
            self.results[index], self.infos[index] = result, info
        if self._on_done is not None:
            self._on_done(index)

    def _next(self) -> tuple[_Job, bool] | None:
        with self._lock:
            if self.stop:
                return None
            if self.fresh:
                self.running += 1
                return self.fresh.popleft(), False
            if self.put_aside:
                self.running += 1
                return self.put_aside.popleft(), True
            return None

    def _ran(self) -> None:
        with self._lock:
            self.running -= 1
            self._lock.notify_all()

    def drain(self) -> None:
        """The caller's thread: work until every job is finished, the helpers' included (a helper
        whose worker is still starting is not waited for: it finds nothing left and ends)."""
        try:
            while True:
                self.work()
                with self._lock:
                    while self.running and not (self.fresh or self.put_aside):
                        self._lock.wait()
                    if self.stop or not (self.running or self.fresh or self.put_aside):
                        return
        finally:
            self.done.set()

    def help(self) -> None:
        """A helper thread of the default choice. It takes jobs only once a worker of its own is
        ready (pool.start_ready): a worker's start (0.1-0.4 s on a GPU host: an interpreter,
        NVRTC's load, the driver's initialisation in NVRTC's first compile) never holds up a job
        taken meanwhile. Where other processes run batches on this node too, it waits first:
        their callers compile already, and starts of workers there only slow the
        initialisations that every compiling process pays (FLEET_WAIT_S)."""
        if self.done.wait(SETTLE_S):
            return
        # Race: processes started together join the node's batches within a few milliseconds of
        # each other; SETTLE_S later every one of them sees the others (a later one sees the
        # earlier ones anyway). A process that starts a moment later than the settle still sees
        # this batch and starts no worker of its own in its first FLEET_WAIT_S.
        if self.fleet is None:  # one look per batch: helpers looking at once would not see more
            self.fleet = slots.batches_now() > 1
        if self.fleet and self.done.wait(max(0.0, self.began + FLEET_WAIT_S - time.monotonic())):
            return
        if workers_pool().start_ready():
            self.work()

    def work(self) -> None:
        """Run jobs until none is left (every worker thread, and the caller's, runs this)."""
        while True:
            picked = self._next()
            if picked is None:
                return
            job, again = picked
            if again:
                pause = job.retry_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            try:
                obj = self._try(job)
            except Exception as exc:  # this request's failure: the others go on
                self.finish(job.index, error=exc)
                self._ran()
                continue
            except BaseException:
                self._ran()
                raise
            if obj is None:  # a peer holds the key: put it aside, try again later
                # Race: the peer may publish and release right after this try. The next try
                # then takes the lock and re-reads the store under it (fly), so it finds
                # the entry: a hit, never a second compile (tests: the exact-count ones).
                now = time.monotonic()
                job.retry_at = now + _RETRY_S
                job.give_up_at = job.give_up_at or now + self.budget
                with self._lock:
                    self.put_aside.append(job)
                self._ran()
                continue
            self.finish(job.index, obj, job.info)
            self._ran()

    def _try(self, job: _Job) -> ObjectCode | None:
        here = threading.current_thread() is self.here
        call = Call(job.info, processes=self.processes and not here, remote=self.remote)
        if job.look is None:
            return compile_uncached(job.request, call)
        # Waited the whole budget for a peer that still holds the key (a hung process, a dead
        # NFS lock server)? Then compile on our own, as compile_program does then.
        gave_up = bool(job.give_up_at) and time.monotonic() >= job.give_up_at
        flight = SingleFlight.for_store(job.look.cache, job.look.flight_key, 0.0 if gave_up else self.budget)
        return fly(job.look, call, flight, wait=gave_up)


def run_batch(
    requests: Iterable[Mapping[str, Any]],
    cache: ProgramCacheResource | None,
    max_workers: int | None,
    *,
    fields: frozenset[str] = REQUEST_FIELDS,
    what: str = "compile_many",
    strict: bool = True,
    on_done: Callable[[int], object] | None = None,
    processes: bool | None = None,
    remote: Any = None,
) -> _Batch:
    """The batch run to its end: ``.results``, ``.errors`` and ``.infos`` by request index.

    Bad arguments raise at once, before anything compiles; with ``strict=False`` a request
    whose arguments are wrong is that request's error instead. ``on_done(index)`` is called
    (from any thread) as each request finishes. ``processes``: as compile_many's. ``remote``:
    a runner that takes the C++ misses (runners.remote.OnExecutor; processes is then False).
    """
    normalized = normalize_requests(requests, fields, what)
    workers = worker_count(max_workers)
    batch_uses_processes(processes, 0)  # a wrong value raises before anything compiles
    store = None if config.disabled() else resolve_cache(cache)
    batch = _Batch([], len(normalized), config.wait_timeout_s(), on_done)
    jobs = _hits_first(batch, normalized, store, strict, what)
    if not jobs:
        return batch  # all hits: no thread started
    batch.fresh.extend(_sources_apart(jobs))
    batch.remote = remote
    batch.processes = remote is None and batch_uses_processes(processes, len(jobs))
    if batch.processes and processes is None:
        batch.here = threading.current_thread()
    workers = batch_threads(workers, len(jobs), default_choice=batch.here is not None and max_workers is None)
    if batch.here is not None and max_workers is None:
        # The default's threads are no more than the node's free compile slots: on a node where
        # other processes compile already, a worker's start would only wait for a slot (or add
        # an NVRTC start, ~0.2 s on a GPU host, to cores that are busy).
        workers = max(1, min(workers, slots.free_now()))
    if batch.processes:  # every thread may hold a worker at once
        workers_pool().limit = max(workers_pool().limit, workers - (batch.here is not None))
    helper = batch.help if batch.here is not None else batch.work
    threads = [
        threading.Thread(target=helper, name=f"kernelcache-compile-{n}", daemon=batch.here is not None)
        for n in range(1, workers)
    ]
    presence = slots.join_batches() if batch.here is not None and threads else None
    for thread in threads:
        thread.start()
    try:
        batch.drain()
    except BaseException:
        batch.stop = True  # Ctrl-C: the threads finish their current compile and take no more
        raise
    finally:
        if presence is not None:
            presence.release()
    if batch.here is None:
        for thread in threads:
            thread.join()
    return batch


def _sources_apart(jobs: list[_Job]) -> list[_Job]:
    """The misses in the order they are taken: one of each source first, round robin over the
    sources (each source's own jobs in request order).

    Why: the instantiations of one template (one source and options, other name expressions)
    share one preprocessing. The first compile of it runs the header pass; the later ones skip
    it once that pass's hint is stored (compile.tracing), but not while it still runs. Taken in
    request order, N takers (this batch's threads, and every process's batch over the same
    requests, which skip the keys a peer holds) start N instantiations of one source together,
    and each runs the pass: 59 passes for 120 CuPy kernels in 8 processes on the H200 host.
    Taken one source at a time, the first round runs the passes that are needed and a source's
    next instantiation comes about a round later. Only the order changes; untracked sources (no
    header pass) and uncached calls each count as a source of their own.
    """
    groups: dict[object, list[_Job]] = {}
    for job in jobs:
        look = job.look
        if look is not None and look.track:
            source: object = tuple(c for c in look.base if c[0] != "name_expressions")
        else:
            source = job.index
        groups.setdefault(source, []).append(job)
    if len(groups) == len(jobs):
        return jobs
    rounds = max(len(group) for group in groups.values())
    return [group[n] for n in range(rounds) for group in groups.values() if n < len(group)]


def _hits_first(
    batch: _Batch, normalized: list[dict[str, Any]], store: ProgramCacheResource | None, strict: bool, what: str
) -> list[_Job]:
    """Look every request up in this thread: hits finish now; the misses come back as jobs."""
    jobs = []
    for i, fields_given in enumerate(normalized):
        fields_given.pop("name", None)
        call = Call(CompileInfo())
        try:
            request, look = _lookup(i, store, fields_given, what)
            lockfile.record(request)  # KERNELCACHE_RECORD
        except Exception as exc:
            if strict:
                raise
            batch.finish(i, error=exc)
            continue
        if look is None:
            jobs.append(_Job(i, None, request))
            continue
        found = look.find()
        call.info.lookup_seconds = time.perf_counter() - call.start
        if found[1] is None:
            jobs.append(_Job(i, look, request))
            continue
        try:
            batch.finish(i, replay_hit(look, found, call), call.info)
        except Exception as exc:
            batch.finish(i, error=exc)
    return jobs


def _lookup(
    index: int,
    store: ProgramCacheResource | None,
    fields: dict[str, Any],
    what: str,
) -> tuple[CompileRequest, Lookup | None]:
    """The request and its key material (None when the cache is disabled)."""
    try:
        request = CompileRequest.from_mapping(fields)
        return request, (None if store is None else Lookup(store, request))
    except (TypeError, ValueError) as exc:  # a wrong argument: raise now, naming the request
        if type(exc) not in (TypeError, ValueError):
            raise
        raise type(exc)(f"{what}: request #{index}: {exc}") from exc


def compile_many(
    requests: Iterable[Mapping[str, Any]],
    *,
    cache: ProgramCacheResource | None = None,
    max_workers: int | None = None,
    processes: bool | None = None,
) -> list[ObjectCode]:
    """compile_program for every request at once; the results in request order.

    Each request is a mapping of compile_program's arguments: ``code``, and optionally
    ``code_type``, ``target_type``, ``options``, ``name_expressions``, ``extra_digest``.
    Hits are looked up first; misses compile on up to ``max_workers`` threads (default:
    the CPU count). ``processes=True``: each thread hands its C++ compiles to a worker
    process. None (default): so do all threads but the caller's, which compiles here, when
    at least runners.choice.MIN_MISSES misses remain on a host with more than one usable core.
    Workers are started once per process and reused; results, logs and errors are those of
    a compile in this process; a worker killed during a compile costs that compile one retry.
    Processes sharing the store split the misses: each compiles the keys no peer is
    compiling first, and waits only at the end for the keys a peer holds.
    A request that fails does not stop the others: once they all finished (and were
    stored), CompileManyError is raised with ``.errors`` (request index -> exception) and
    ``.results`` (None where failed). Malformed requests raise TypeError/ValueError at
    once, before anything compiles.
    """
    batch = run_batch(requests, cache, max_workers, processes=processes)
    if batch.errors:
        raise CompileManyError(batch.errors, batch.results)
    return batch.results
