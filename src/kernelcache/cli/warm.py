"""``kernelcache warm``: every request of a manifest compiled into the cache, each in its own
working directory, and counted as ok only once the cache holds it.

The manifest and its requests are cli/manifest.py's. Requests recorded in one working
directory are compiled there together (compile_many: hits first, misses on threads), one
directory after another: the working directory is the process's. A kernel is ok when it was
already there or was compiled and is found in the cache afterwards; a compile returned but
not stored (a header under KERNELCACHE_BASE_DIR that names its path, NVRTC's --restrict
leak, a failed write) is that kernel's failure with its reason.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from typing import Any

from kernelcache.cli.manifest import WarmItem, for_archs, load_manifest, program_options, request_of

__all__ = ["WarmItem", "for_archs", "load_manifest", "not_in_bundle", "program_options", "request_of", "run", "warm"]


def warm(
    manifest: str,
    *,
    archs: Sequence[str] = (),
    executor: Executor | None = None,
    cache_dir: str | None = None,
    redis_url: str | None = None,
    jobs: int | None = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """``kernelcache warm MANIFEST`` as a call: every kernel of the manifest (or lockfile) compiled
    into the cache (``cache_dir`` or the default one, and Redis at ``redis_url``), for each of
    ``archs`` instead of its recorded arch where given. ``executor``: any concurrent.futures.Executor
    (Dask's ``Client.get_executor()``, a ProcessPoolExecutor, Ray's) whose workers run the C++
    compiles; the keys and bytes are those a local warm stores. One result per kernel, in manifest
    order: ``hit``, ``key`` or ``error`` (a compile refused or not stored is an error); ``progress``:
    a bar (or a line per kernel) on stderr.
    KERNELCACHE_REQUIRE_HIT does not apply to warm's own compiles (it is restored afterwards)."""
    from kernelcache.cli.demo import check_arch

    items = load_manifest(manifest)
    if archs:
        items = for_archs(items, [check_arch(a) for a in archs])
    # Warming is how a strict program's cache is filled: its compiles are what was asked for, not
    # misses to refuse. "0" (not unset) so a config file cannot turn strict mode back on; compiler
    # worker processes inherit it.
    before = os.environ.get("KERNELCACHE_REQUIRE_HIT")
    os.environ["KERNELCACHE_REQUIRE_HIT"] = "0"
    try:
        return run(items, cache_dir, jobs or os.cpu_count() or 1, progress, redis_url, executor)
    finally:
        if before is None:
            os.environ.pop("KERNELCACHE_REQUIRE_HIT", None)
        else:
            os.environ["KERNELCACHE_REQUIRE_HIT"] = before


@contextlib.contextmanager
def working_directory(cwd: str | None) -> Iterator[str]:
    """Run the body in ``cwd`` (a recorded request's working directory; None: stay here; "": it
    was recorded in a deleted directory).

    Yields "" or, where ``cwd`` cannot be entered here, a note: the body then runs in a new
    empty directory, so that nothing a compile would have found through its own working
    directory is found in another one by chance. The previous directory is restored.
    """
    if cwd is None:
        yield ""
        return
    try:
        here = os.getcwd()
    except OSError:  # warm's own directory was deleted: there is nothing to return to
        here = "/"
    empty = None
    try:
        if not cwd:
            raise FileNotFoundError(cwd)
        os.chdir(cwd)
        note = ""
    except OSError as exc:
        empty = tempfile.mkdtemp(prefix="kernelcache-replay-")
        os.chdir(empty)
        why = "is not here" if isinstance(exc, FileNotFoundError) else f"cannot be entered ({exc.strerror})"
        what = f"its recorded working directory {cwd} {why}" if cwd else "it was recorded in a deleted directory"
        note = f"replayed in an empty directory: {what}"
    try:
        yield note
    finally:
        os.chdir(here)
        if empty is not None:
            with contextlib.suppress(OSError):
                os.rmdir(empty)


def run(
    items: list[WarmItem],
    cache_dir: str | None,
    jobs: int,
    progress: bool,
    redis_url: str | None = None,
    executor: Executor | None = None,
) -> list[dict[str, Any]]:
    """Warm every item through compile_many on ``jobs`` threads; results in manifest order.
    ``executor``: its workers run the C++ compiles (runners.remote), up to remote.IN_FLIGHT at once;
    everything else (keys, single flight, headers, the stores) is as without it.

    The store is configured as the default cache is (KERNELCACHE_MAX_SIZE, a Redis tier from
    ``redis_url`` or KERNELCACHE_REDIS_URL, ...), at ``cache_dir``. Each result has ``hit``
    (it was already there), ``key`` (the entry's name) or ``error``; ``note`` where the
    replay was not the recorded one (its working directory is not here).

    The hits are looked up first, in this thread: a manifest that is all hits starts no
    thread at all, so ``-j 8`` costs what ``-j 1`` does there. A failing item is reported
    as its own error; the others are compiled and stored all the same.
    """
    from kernelcache.stores.default import configured_cache

    results, requests = _requests(items)
    cache = configured_cache(None if cache_dir is None else os.path.abspath(cache_dir), redis_url)
    remote = None
    if executor is not None:
        from kernelcache.compile.metadata import refuse_to_store
        from kernelcache.runners.remote import IN_FLIGHT, OnExecutor

        remote = OnExecutor(executor, on_refused=lambda why: refuse_to_store(cache, why))
        jobs = max(jobs, IN_FLIGHT)
    todo = [i for i, r in enumerate(results) if "error" not in r and "skipped" not in r]
    groups: dict[str | None, list[int]] = {}
    for i in todo:  # manifest order within a directory; directories in order of first use
        groups.setdefault(items[i].cwd, []).append(i)
    # The cache is closed at the end: its counters' pending tally is written then (the caller reads them).
    with contextlib.closing(cache), _progress(items, len(todo), progress) as on_done:
        for cwd, group in groups.items():
            # Race: the working directory is the process's. warm compiles one directory's
            # requests at a time and nothing else in this process compiles meanwhile;
            # a compiler worker takes the caller's directory with each compile.
            with working_directory(cwd) as note:
                _warm_group(group, requests, results, cache, jobs, on_done, remote)
            if note:
                for i in group:
                    results[i]["note"] = note
    for r in results:
        r.setdefault("hit", False)
    return results


def _warm_group(
    group: list[int],
    requests: list[dict[str, Any]],
    results: list[dict[str, Any]],
    cache: Any,
    jobs: int,
    on_done: Any,
    remote: Any = None,
) -> None:
    """One directory's requests through compile_many; ok: a hit, or a compile the cache took."""
    from kernelcache.compile.batch import run_batch

    tick = None if on_done is None else (lambda j: on_done(group[j]))
    todo = [requests[i] for i in group]
    batch = run_batch(todo, cache, jobs, what="warm", strict=False, on_done=tick, remote=remote)
    for j, i in enumerate(group):
        info = batch.infos[j]
        if j in batch.errors or info is None:
            results[i].update(hit=False, error=_error_text(batch.errors.get(j) or RuntimeError("no result")))
            continue
        results[i].update(hit=info.hit, key=info.entry_name, seconds=info.seconds)
        if info.hit:
            continue  # already there
        if not info.cached:  # returned but not stored (a refusal, or a write the store dropped)
            results[i]["error"] = f"not stored: {info.not_stored or 'the compile was returned but not stored'}"


def not_in_bundle(results: list[dict[str, Any]], path: str, secret: bytes | None) -> list[str]:
    """The names of the warmed kernels missing from the bundle at ``path``; each such result
    gets its error (an entry that left the cache between the warm and the bundle)."""
    from kernelcache.stores.bundle.store import BundleProgramCache

    with BundleProgramCache(path, secret=secret) as bundle:
        names = set(bundle.names())
    missing = []
    for r in results:
        if r.get("key") and not r.get("error") and r["key"] not in names:
            r["error"] = f"not in the bundle {path}: its entry left the cache before the bundle was written"
            missing.append(r["name"])
    return missing


def _requests(items: list[WarmItem]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each item's result so far (an error for bad options, skipped for Triton) and its request."""
    results: list[dict[str, Any]] = [
        {"name": item.name, "arch": item.arch, "target_type": item.target_type} for item in items
    ]
    requests: list[dict[str, Any]] = []
    for item, result in zip(items, results):
        if item.code_type == "triton":
            result["skipped"] = "a Triton kernel: Triton compiles it when the program runs"
            requests.append({})
            continue
        try:
            request = request_of(item)
        except ValueError as exc:
            result["error"] = _error_text(exc)
            requests.append({})
            continue
        requests.append(request._asdict())
    return results, requests


@contextlib.contextmanager
def _progress(items: list[WarmItem], total: int, progress: bool) -> Iterator[Any]:
    """``on_done(item index)`` for the batches: a bar on a terminal, a line per item in a log."""
    if not progress:
        yield None
    elif sys.stderr.isatty():
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task("warming", total=total)
        try:
            yield lambda _i: bar.advance(task)
        finally:
            bar.stop()
    else:
        yield _line_per_item(items, total)


def _line_per_item(items: list[WarmItem], total: int) -> Any:
    """Without a terminal (CI logs): one line on stderr per finished item, as it finishes."""
    import threading

    lock = threading.Lock()
    done = [0]

    def on_done(i: int) -> None:
        item = items[i]
        with lock:  # on_done runs on the batch's worker threads
            done[0] += 1
            print(f"warm [{done[0]}/{total}] {item.name} [{item.arch} {item.target_type}]", file=sys.stderr)
            sys.stderr.flush()

    return on_done


def _error_text(exc: BaseException) -> str:
    """The error as the user needs it: its type and its whole text (a compile log is many lines)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}"
