"""ObjectStoreProgramCache: a shared tier in a bucket (S3, GCS, Azure) or a directory, via obstore.

One object per entry, ``<prefix>e/<entry name>`` (the one naming rule of ``stores.naming``),
holding the same record as Redis (``stores.record``): the artifact and its metadata under one
checksum or HMAC, bound to the object's name.

Who may touch what: records are immutable and created only if absent (a conditional create),
so two hosts writing one key never overwrite each other; a second write of a key keeps the
first record. The one exception is a record this store can prove damaged (its own format and
secret, a tag that does not match): a writer replaces exactly that version (If-Match), and a
reader leaves it in place. A reader never deletes anything; ``read_only=True`` writes and
deletes nothing. Eviction is the bucket's own lifecycle rules (README, "The object store").

Faults: a store that cannot be reached (refused, timed out, a 5xx to every request) costs
one bounded timeout: the call is a miss or a dropped write, warned about once, and the store
is skipped for ``retry_after_s`` (doubling while it stays down). A refusal (permissions,
credentials) fails that one call and is warned about once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlsplit

from kernelcache.config.urls import check_object_store_url
from kernelcache.stores import record as rec
from kernelcache.stores.backoff import Backoff
from kernelcache.stores.base import Meta, RecordStore
from kernelcache.stores.naming import entry_name
from kernelcache.stores.object import conn
from kernelcache.stores.object import lock as objlock

_BACKOFF_S = 5.0
_MAX_PARALLEL_GETS = 16
# A request answered after this long is a store too slow to wait on: backed off as if down.
# Far above a healthy store's latency (tens of milliseconds) and well under the request
# timeout (10 s), which bounds a store that does not answer at all.
_SLOW_REQUEST_S = 2.0


def _is_relative_path(prefix: object) -> bool:
    """Whether ``prefix`` names objects the store accepts: '' or parts joined by '/'."""
    if not isinstance(prefix, str):
        return False
    parts = prefix.removesuffix("/").split("/") if prefix else []
    return all(p not in ("", ".", "..") and p.isprintable() for p in parts)


class ObjectStoreProgramCache(RecordStore):
    """A ProgramCacheResource in an object store, shared by every host that can reach it.

    ``url``: ``s3://bucket/path``, ``gs://bucket/path``, ``az://container/path``,
    ``file:///directory`` or ``memory:///``. Credentials come from the environment, as
    obstore and each cloud's tools take them. ``secret`` (bytes or str) signs and verifies
    records. ``read_only=True`` never writes or deletes. ``prefix`` names this cache's
    objects inside the URL's path. ``client_options``: obstore's HTTP client options (the
    defaults bound every request: 10 s, 3 s to connect). ``retry_after_s``: how long a store
    that cannot be reached is skipped (doubling while it stays down); ``slow_request_s``: a
    request answered after longer than this backs off the same way. ``lock_ttl_s``: expiry
    of the single-flight lock objects, rewritten while their holder compiles.
    """

    def __init__(
        self,
        url: str,
        *,
        secret: bytes | str | None = None,
        read_only: bool = False,
        prefix: str = "kernelcache/",
        client_options: Mapping[str, Any] | None = None,
        retry_after_s: float = _BACKOFF_S,
        lock_ttl_s: float = objlock.DEFAULT_TTL_S,
        slow_request_s: float = _SLOW_REQUEST_S,
    ) -> None:
        super().__init__()
        self.url = check_object_store_url(url)
        if not _is_relative_path(prefix):
            raise ValueError(
                f"prefix must be a relative path like 'kernelcache/' (no empty, '.' or '..' part, no control "
                f"character: the object store refuses such names at every call), got {prefix!r}"
            )
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise ValueError("secret must be non-empty bytes or str, or None")
        for label, value in (
            ("retry_after_s", retry_after_s),
            ("lock_ttl_s", lock_ttl_s),
            ("slow_request_s", slow_request_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        if client_options is not None and not isinstance(client_options, Mapping):
            raise TypeError(f"client_options must be a mapping of obstore client options, not {type(client_options)}")
        self._secret = secret
        self._read_only = bool(read_only)
        self._prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self._lock_ttl_s = float(lock_ttl_s)
        self._client_options = client_options
        self._store = conn.make_store(url, client_options)
        self._local_root = unquote(urlsplit(url).path) if url.startswith("file://") else None
        self._retry_after_s = float(retry_after_s)
        self._slow_s = float(slow_request_s)
        self._health = Backoff(retry_after_s)
        self.last_error = ""

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def has_remote_lock(self) -> bool:
        # A read_only store must not make others wait for it; a local directory or memory
        # store is not shared between hosts (its processes meet on the file tier's locks).
        return not self._read_only and not self.url.startswith(("file://", "memory://"))

    def _path(self, key: bytes) -> str:
        return f"{self._prefix}e/{entry_name(key)}"

    # -- calling the store safely --------------------------------------------------------------

    def call(self, what: str, fn: Any) -> Any:
        """Run fn(client) (for this store and its modules: lock.py, listing.py); on a failure
        return None (warned once, counted, maybe backing off). A call that answers but takes
        longer than ``slow_request_s`` backs off like one that failed: a store that is slow
        but up (3 s per request) would otherwise cost every request of a compile in turn,
        and nothing would ever start the back-off."""
        if not self._health.may_call() or not self._usable_here():
            return None
        started = time.monotonic()
        conn.note_call()
        try:
            result = fn(self._store)
        except (conn.errors().BaseError, OSError, TimeoutError) as exc:
            self._failed(what, exc)
            return None
        finally:
            self._health.settled()  # a probe interrupted by anything else (Ctrl-C) is let go
        took = time.monotonic() - started
        if took > self._slow_s:
            pause = self._health.failed()
            self.last_error = f"answered in {took:.1f} s"
            self.warn_once(
                f"slow-{what}",
                f"the object store {self.url} took {took:.1f} s to {what} (more than slow_request_s="
                f"{self._slow_s:g} s): it is skipped for {pause:g} s, then tried again, as if down "
                "(compiles still work)",
                counted_as="unreachable",
            )
        else:
            self._health.healthy()
        return result

    def _failed(self, what: str, exc: BaseException) -> None:
        why = conn.explain(exc, self.url)
        self.last_error = why
        kind = type(exc).__name__
        effect = "the write is dropped" if what == "write" else "treated as a miss"
        if conn.no_such_bucket(exc) or conn.plain_http(exc):
            # The set-up, not this call: one warning whichever call meets it first.
            self._health.healthy()
            self._unusable(why)
            return
        if conn.answered(exc):
            self._health.healthy()
            self.warn_once(
                f"refused-{what}-{kind}-{why[:40]}",
                f"the object store {self.url} refused to {what}: {why}; {effect}",
                counted_as="refused",
            )
            return
        pause = self._health.failed()
        self.warn_once(
            f"{what}-{kind}",
            f"the object store {self.url} failed to {what}: {why}; {effect} (compiles still work); "
            f"it is skipped for {pause:g} s, then tried again",
            counted_as="unreachable",
        )

    def _usable_here(self) -> bool:
        if conn.usable_here():
            return True
        self.warn_once(
            "forked",
            f"the object store {self.url} is not used in this process: it was forked from one that had used "
            "an object store, and obstore's runtime does not survive fork() (a call would wait forever); "
            "start such processes with spawn, or use the store only after forking",
            counted_as="unreachable",
        )
        return False

    def after_fork_in_child(self) -> None:
        """A forked child judges the store afresh: a back-off (or a probe) of the parent's,
        maybe begun by a thread the child does not have, must not skip the store in the child."""
        super().after_fork_in_child()
        self._health = Backoff(self._retry_after_s)
        # The parent's client runs on threads the child does not have (obstore's runtime): a
        # child using it can wait forever. It makes its own on its first call.
        self._store = conn.make_store(self.url, self._client_options)

    def _unusable(self, why: str) -> None:
        message = f"the object store {self.url} cannot be used: {why}; reads are misses, writes are dropped"
        self.warn_once(f"unusable-{why[:48]}", message, counted_as="refused")

    @property
    def entries_prefix(self) -> str:
        """Where this store's entries are, as listed (``<prefix>e/``)."""
        return f"{self._prefix}e/"

    def decode(self, path: str, raw: bytes) -> tuple[rec.Verdict, tuple[bytes, Meta] | None]:
        """The record ``raw`` read at ``path``, checked with this store's secret."""
        return rec.decode(path, raw, self._secret)

    # -- the store -------------------------------------------------------------------------------

    def get_raw(self, path: str) -> Any:
        """(bytes, e_tag) of the object at path, False when there is none, None when the call failed."""
        return self.call("read", conn.get_raw(path, self._local_root))

    def _read(self, key: bytes) -> tuple[bytes, Meta] | None:
        return self._read_path(self._path(key))

    def _read_path(self, path: str) -> tuple[bytes, Meta] | None:
        found = self.get_raw(path)
        if not found:
            return None
        verdict, record = rec.decode(path, found[0], self._secret)
        if verdict is rec.Verdict.OK:
            return record
        if verdict is rec.Verdict.DAMAGED:
            self.warn_once(
                "corrupt",
                f"object {path} in {self.url} is {verdict.value}; a miss, left in place"
                + ("" if self._read_only else " (the next write of this key replaces it)"),
                counted_as="corrupt",
            )
        else:
            self._warn_unverifiable(path, verdict)
        return None

    def _read_many(self, keys: Sequence[bytes]) -> list[tuple[bytes, Meta] | None]:
        # One round trip: the GETs run at once (obstore releases the GIL while it waits).
        if len(keys) <= 1:
            return [self._read(k) for k in keys]
        with ThreadPoolExecutor(max_workers=min(len(keys), _MAX_PARALLEL_GETS)) as pool:
            return list(pool.map(self._read, keys))

    def _warn_unverifiable(self, path: str, verdict: rec.Verdict) -> None:
        where = f"object {path} in {self.url}"
        cause, message = rec.unverifiable_warning(verdict, where, "KERNELCACHE_OBJECT_STORE_SECRET")
        self.warn_once(cause, message, counted_as="unverifiable")

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        return self._write_at(self._path(key), payload, meta)

    def read_named(self, name: str) -> tuple[bytes, Meta] | None:
        """The checked (payload, meta) of the entry ``name``, uncounted (``kernelcache import``)."""
        return self._read_path(f"{self._prefix}e/{name}")

    def write_named(self, name: str, payload: bytes, meta: Meta) -> bool:
        """Store an entry by its name (naming.entry_name of its key): ``kernelcache import``."""
        return self._write_at(f"{self._prefix}e/{name}", payload, meta)

    def _write_at(self, path: str, payload: bytes, meta: Meta) -> bool:
        if self._read_only:
            return False  # a consumer: never writes (by choice, not an error)
        record = rec.encode(path, payload, meta, self._secret)
        outcome = self.call("write", conn.put(path, record, "create"))
        if outcome == "no-bucket":
            self._unusable(f"the bucket or container of {self.url} does not exist")
        elif outcome == "exists":
            return self._replace_if_damaged(path, record)
        return outcome == "written"

    def _replace_if_damaged(self, path: str, record: bytes) -> bool:
        """Replace the record at path only if it is provably damaged, and only that version of it."""
        found = self.get_raw(path)
        if not found:
            return False
        verdict, _ = rec.decode(path, found[0], self._secret)
        if verdict is rec.Verdict.OK:
            return False  # a peer stored this key first: its record stays
        if verdict is not rec.Verdict.DAMAGED or found[1] is None:
            self._warn_unverifiable(path, verdict)
            return False
        # Race: a peer may replace the damaged version between our read and this write; the
        # write is conditional on the version we judged, so the peer's record survives.
        outcome = self.call("write", conn.put(path, record, {"e_tag": found[1]}))
        return outcome == "written"

    def _remove(self, key: bytes) -> bool:
        self._check_writable("delete entries")
        path = self._path(key)
        import obstore

        def remove(store: Any) -> bool:
            try:
                obstore.head(store, path)
            except FileNotFoundError:
                return False
            obstore.delete(store, path)
            return True

        removed = self.call("delete", remove)
        if removed is None:
            raise ConnectionError(f"the object store {self.url} could not be reached: {path} may not be removed")
        return bool(removed)

    def _entry_paths(self, store: Any) -> list[str]:
        return [m["path"] for batch in conn.listing(store, self.entries_prefix) for m in batch]

    def __len__(self) -> int:
        return len(self.call("count", self._entry_paths) or ())

    def iter_records(
        self, skipped: list[tuple[str, rec.Verdict]] | None = None
    ) -> Iterator[tuple[str, bytes, Meta, Any]]:
        """Every record that passes its check, for ``bundle create`` (stores/object/listing.py)."""
        from kernelcache.stores.object import listing

        return listing.iter_records(self, skipped)

    def clear(self) -> None:
        """Delete this prefix's entries (a command a person runs: every host's records go)."""
        self._check_writable("clear")
        import obstore

        def delete_all(store: Any) -> None:
            paths = self._entry_paths(store)
            for i in range(0, len(paths), 1000):
                obstore.delete(store, paths[i : i + 1000])

        self.call("clear", delete_all)

    # -- single flight across hosts ------------------------------------------------------------

    @contextlib.contextmanager
    def remote_lock(self, name: str, deadline: float, ready: Any, local_lock: str | None = None) -> Iterator[str]:
        """Hold the lock object ``name`` for every host sharing the bucket ("acquired"), or learn
        that a peer finished ("ready"), or give up at ``deadline`` ("timeout"). A read_only
        store, a local directory or memory store, or a store that cannot be reached:
        "unavailable" at once (the caller's file lock still serialises this host)."""
        if not self.has_remote_lock:
            yield "unavailable"
            return
        path = f"{self._prefix}locks/{name}"
        with objlock.hold(self.call, path, self._lock_ttl_s, deadline, ready) as outcome:
            yield outcome

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["read_only"] = int(self._read_only)
        out["backing_off"] = int(self._health.down_now())
        out["skipped_while_down"] = self._health.skipped
        return out


__all__ = ["ObjectStoreProgramCache"]
