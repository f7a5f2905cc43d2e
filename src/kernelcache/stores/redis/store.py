"""RedisProgramCache: a shared tier on a real Redis server (single server or Redis Cluster).

One Redis string per entry, ``<namespace>:e:<entry name>`` (the one naming rule of ``stores.naming``),
holding a record that carries the artifact and its metadata, checked as one (``stores.record``).

Who may touch what: a reader never deletes what it cannot verify (signed with another secret,
signed while it has none, a format it does not know); it removes only what it can prove damaged
(its own format and secret, a checksum that does not match), and a ``read_only`` store writes and
deletes nothing at all, counters included. A writer never overwrites an entry it cannot verify
either; a host whose secret is not the fleet's says so, once.

Faults: a server that cannot be reached (refused, timed out, cluster down) costs one socket timeout:
the call is a miss or a dropped write, warned about once, and the store skips Redis for
``retry_after_s`` (doubling while it stays down). A server that answers with an error (out of
memory under ``noeviction``, a read-only replica) is not down: that one write is dropped with one
warning, and reads go on.

Single flight across hosts: ``remote_lock`` (lock.py); fleet counters: fleet.py; listings: listing.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from kernelcache.log import logger
from kernelcache.stats import ErrorCause, error_deltas
from kernelcache.stores import record as rec
from kernelcache.stores.backoff import Backoff
from kernelcache.stores.base import Meta, RecordStore, check_max_size
from kernelcache.stores.naming import entry_name
from kernelcache.stores.redis import fleet as redisfleet
from kernelcache.stores.redis import lock as redislock
from kernelcache.stores.redis.conn import given_client, make_client, unreachable_errors

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MAX_ENTRY_BYTES = 64 * 1024 * 1024
_BACKOFF_S = 5.0
# About 31 years: beyond it a socket timeout overflows time_t and Redis refuses the PX.
_MAX_SECONDS = 1e9

# Set the record unless the key holds one this writer must not replace: only an absent key, a
# record of the previous format, one under this writer's own prefix (same format and secret) or,
# for a signed writer, an unsigned record. Else the first bytes answer: the writer says why.
_SET_LUA = """
local cur = redis.call('getrange', KEYS[1], 0, 12)
if cur == '' or cur == ARGV[2] or string.sub(cur, 1, 4) == 'KCR1'
   or (ARGV[3] == '1' and string.sub(cur, 1, 5) == 'KCR2' .. string.char(0)) then
  if ARGV[4] == '' then redis.call('set', KEYS[1], ARGV[1])
  else redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[4]) end
  return 1
end
return cur
"""
# Delete only the value judged damaged: a good record a writer put there since our GET must survive.
_DELETE_IF_UNCHANGED_LUA = """
local cur = redis.call('get', KEYS[1])
if cur and redis.sha1hex(cur) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


_NAME_GLOB = "[0-9a-f]" * len(entry_name(b""))


def _glob_escape(text: str) -> str:
    """``text`` as a literal inside a Redis glob pattern (SCAN MATCH)."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


def _seconds_ok(value: object) -> bool:
    """A positive, finite number of seconds that Redis can take in milliseconds (PX)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return 0 < value < _MAX_SECONDS


class RedisProgramCache(RecordStore):
    """A ProgramCacheResource on Redis, shared by every machine that can reach the server.

    ``url``: ``redis://host:port/db``, ``rediss://`` (TLS), ``redis+cluster://host:port`` for
    Redis Cluster, or a ready redis-py client (Redis or RedisCluster). ``namespace`` prefixes every
    key; ``len()`` and ``clear()`` touch this namespace only. ``ttl`` (seconds) expires entries;
    entries over ``max_entry_bytes`` are skipped with a warning. ``secret`` (bytes or str) signs
    and verifies entries. ``read_only=True`` never writes or deletes anything. ``socket_timeout``
    bounds every call; a server that cannot be reached is skipped for ``retry_after_s`` (doubling
    while it stays down, up to 5 minutes). ``lock_ttl_s``: expiry of single-flight locks,
    refreshed while their holder compiles.
    """

    def __init__(
        self,
        url: Any = DEFAULT_URL,
        *,
        namespace: str = "kernelcache",
        ttl: float | None = None,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        secret: bytes | str | None = None,
        read_only: bool = False,
        socket_timeout: float = 1.0,
        retry_after_s: float = _BACKOFF_S,
        lock_ttl_s: float = redislock.DEFAULT_TTL_S,
    ) -> None:
        super().__init__()
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("namespace must be a non-empty str")
        # Finite, and within what Redis takes as PX: NaN or infinity would be accepted here
        # and then make every call raise (a socket timeout) or every write be refused (a TTL).
        if ttl is not None and not _seconds_ok(ttl):
            raise ValueError(f"ttl must be a positive number of seconds (at most 1e9) or None, got {ttl!r}")
        for label, value in (
            ("socket_timeout", socket_timeout),
            ("retry_after_s", retry_after_s),
            ("lock_ttl_s", lock_ttl_s),
        ):
            if not _seconds_ok(value):
                raise ValueError(f"{label} must be a positive number of seconds (at most 1e9), got {value!r}")
        self._retry_after = float(retry_after_s)
        self._lock_ttl_ms = max(1, int(lock_ttl_s * 1000))
        self._max_entry = check_max_size(max_entry_bytes)
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise ValueError("secret must be non-empty bytes or str, or None")
        self._secret = secret
        self._prefix = rec.writer_prefix(secret)
        self._ns = namespace
        self._ttl_ms = max(1, int(ttl * 1000)) if ttl is not None else None  # PX 0 is refused
        self._read_only = bool(read_only)
        self._socket_timeout = float(socket_timeout)
        self._client_lock = threading.Lock()
        self._client, self.url = given_client(url)
        self._owns_client = self._client is None  # made from the URL on first use: ours to close
        self._health = Backoff(self._retry_after)
        self.last_error = ""
        self._stats = redisfleet.FleetStats(None if self._read_only else self._send_tally)

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def reads_renew(self) -> bool:
        # With a ttl every key expires that long after its last write, whatever reads it; without
        # one, only the server's maxmemory policy drops keys, and its LRU/LFU ones count reads.
        return self._ttl_ms is None

    @property
    def has_remote_lock(self) -> bool:
        return not self._read_only  # a read_only store must not make others wait for it

    def _entry_key(self, key: bytes) -> str:
        return f"{self._ns}:e:{entry_name(key)}"

    # -- calling Redis safely ----------------------------------------------------------------

    def _connect(self) -> Any:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.url, self._socket_timeout)
            return self._client

    def call(self, what: str, fn: Any) -> Any:
        """Run fn(client) (for this store and listing.py); on a Redis failure return None (warned once, counted)."""
        import redis

        if not self._health.may_call():
            return None  # backing off (one prober per period: stores.backoff)
        try:
            result = fn(self._client if self._client is not None else self._connect())
        except unreachable_errors() as exc:
            self._unreachable(what, exc)
            return None
        except redis.exceptions.RedisError as exc:
            # The server answered: this call failed, the server is not down (no back-off).
            self._health.healthy()
            self._note_error(exc)
            kind = type(exc).__name__
            self.warn_once(
                f"answered-{what}-{kind}",
                f"Redis at {self.url} refused to {what} ({kind}: {str(exc)[:120]}); "
                + ("the write is dropped, reads go on" if what == "write" else "treated as a miss"),
                counted_as="refused",
            )
            return None
        finally:
            # Anything else (Ctrl-C in a notebook) is the caller's; a probe it interrupted
            # must not leave Redis skipped for the life of the process.
            self._health.settled()
        self._health.healthy()
        return result

    def warn_once(self, cause: str, message: str, *, counted_as: ErrorCause) -> None:
        if not redisfleet.on_sender_thread():
            super().warn_once(cause, message, counted_as=counted_as)
            return
        # Warnings filters and catch_warnings are process-wide: a warning raised on the
        # counter thread would land in whatever the program runs meanwhile. Count and log it
        # only; the program's own next call to this store warns if Redis is still down.
        self._stats.add(**error_deltas(counted_as))
        if self._warned.first("sender-" + cause):
            logger.warning("%s: %s", type(self).__name__, message)

    def _note_error(self, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"

    def _unreachable(self, what: str, exc: BaseException) -> None:
        # One failure is enough: a stopped server would otherwise cost a socket timeout
        # on every call of a compile (look-up, lock, store).
        pause = self._health.failed()
        self._note_error(exc)
        kind = type(exc).__name__
        self.warn_once(
            f"{what}-{kind}",
            f"Redis at {self.url} failed to {what} ({kind}: {str(exc)[:120]}); treated as a miss / dropped "
            f"write (compiles still work); Redis is skipped for {pause:g} s, then tried again",
            counted_as="unreachable",
        )

    # -- the store -------------------------------------------------------------------------

    def _read(self, key: bytes) -> tuple[bytes, Meta] | None:
        rk = self._entry_key(key)
        return self._judge(rk, self.call("read", lambda c: c.get(rk)))

    def _read_many(self, keys: Sequence[bytes]) -> list[tuple[bytes, Meta] | None]:
        # One round trip: MGET (on a cluster, redis-py's per-slot MGETs, sent together).
        rks = [self._entry_key(key) for key in keys]
        raws = self.call("read", lambda c: (c.mget_nonatomic if hasattr(c, "mget_nonatomic") else c.mget)(rks))
        return [self._judge(rk, raw) for rk, raw in zip(rks, raws or [None] * len(rks))]

    def _judge(self, rk: str, raw: bytes | None) -> tuple[bytes, Meta] | None:
        """The record in ``raw`` (read from ``rk``) if it passes its check, else None (and why, once)."""
        if raw is None:
            return None
        verdict, record = rec.decode(rk, raw, self._secret)
        if verdict is rec.Verdict.OK:
            return record
        if verdict is rec.Verdict.DAMAGED:
            fate = "a miss (read_only: left in place)" if self._read_only else "a miss, removed"
            self.warn_once("corrupt", f"Redis entry {rk} is {verdict.value}; {fate}", counted_as="corrupt")
            if not self._read_only:
                digest = hashlib.sha1(raw).hexdigest()
                self.call("delete", lambda c: c.eval(_DELETE_IF_UNCHANGED_LUA, 1, rk, digest))
        elif verdict is not rec.Verdict.OLD:  # the previous format is a plain miss
            self._warn_unverifiable(rk, verdict)
        return None

    def _warn_unverifiable(self, rk: str, verdict: rec.Verdict) -> None:
        cause, message = rec.unverifiable_warning(verdict, f"Redis entry {rk}", "KERNELCACHE_REDIS_SECRET")
        self.warn_once(cause, message, counted_as="unverifiable")

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        return self._write_at(self._entry_key(key), payload, meta)

    def read_named(self, name: str) -> tuple[bytes, Meta] | None:
        """The checked (payload, meta) of the entry ``name``, uncounted (``kernelcache import``)."""
        rk = f"{self._ns}:e:{name}"
        return self._judge(rk, self.call("read", lambda c: c.get(rk)))

    def write_named(self, name: str, payload: bytes, meta: Meta) -> bool:
        """Store an entry by its name (naming.entry_name of its key): ``kernelcache import``."""
        return self._write_at(f"{self._ns}:e:{name}", payload, meta)

    def iter_records(
        self, skipped: list[tuple[str, rec.Verdict]] | None = None
    ) -> Iterator[tuple[str, bytes, Meta, Any]]:
        """Every record that passes its check, for ``bundle create`` (stores/redis/listing.py)."""
        from kernelcache.stores.redis import listing

        return listing.iter_records(self, skipped)

    def _write_at(self, rk: str, payload: bytes, meta: Meta) -> bool:
        if self._read_only:
            return False  # a consumer: never writes (by choice, not an error)
        if self._max_entry is not None and len(payload) > self._max_entry:
            self.warn_once(
                "too-large",
                f"an entry of {len(payload)} bytes exceeds max_entry_bytes={self._max_entry}; not stored",
                counted_as="too_large",
            )
            return False
        record = rec.encode(rk, payload, meta, self._secret)
        # The common case, a new key, is one plain SET NX; a key that exists goes through the
        # script, which decides atomically whether its record may be replaced.
        answer = self.call("write", lambda c: 1 if c.set(rk, record, nx=True, px=self._ttl_ms) else 0)
        if answer == 0:
            px = str(self._ttl_ms) if self._ttl_ms is not None else ""
            signed = "1" if self._secret is not None else "0"
            answer = self.call("write", lambda c: c.eval(_SET_LUA, 1, rk, record, self._prefix, signed, px))
        if answer == 1:
            return True
        if isinstance(answer, bytes):  # kept: the key holds a record we cannot verify
            self._warn_unverifiable(rk, rec.owner_of(answer, self._secret))
        return False

    def _remove(self, key: bytes) -> bool:
        self._check_writable("delete entries")
        rk = self._entry_key(key)
        removed = self.call("delete", lambda c: c.delete(rk))
        if removed is None:
            # Unreachable or backing off: "could not" must not read as "absent". (A DEL that
            # timed out may still run when a stalled server wakes up: removal is unknown.)
            raise ConnectionError(f"Redis at {self.url} could not be reached: {rk} may not be removed")
        return bool(removed)

    def decode(self, rk: str, raw: bytes) -> tuple[rec.Verdict, tuple[bytes, Meta] | None]:
        """The record ``raw`` read at ``rk``, checked with this store's secret."""
        return rec.decode(rk, raw, self._secret)

    def scan(self, client: Any) -> Iterator[Any]:
        """The Redis keys of this namespace's entries (SCAN; listing.py uses it too)."""
        # The namespace is matched literally: "ml*" must not match "ml-team".
        # The name is matched as hex digits of its exact length, so that namespace "a" does
        # not match the keys of namespace "a:e:b" either.
        return client.scan_iter(match=f"{_glob_escape(self._ns)}:e:{_NAME_GLOB}", count=1000)

    def __len__(self) -> int:
        found = self.call("count", lambda c: sum(1 for _ in self.scan(c)))
        return int(found or 0)

    def clear(self) -> None:
        """Remove this namespace's entries (SCAN + UNLINK: no KEYS, no FLUSHDB)."""
        self._check_writable("clear")

        def unlink_all(c: Any) -> int:
            # One key per call: keys of a cluster live on different nodes.
            return sum(c.unlink(k) for k in list(self.scan(c)))

        self.call("clear", unlink_all)

    # -- single flight across hosts ------------------------------------------------------------

    @contextlib.contextmanager
    def remote_lock(self, name: str, deadline: float, ready: Any, local_lock: str | None = None) -> Iterator[str]:
        """Hold the cluster-wide lock ``name`` (yields "acquired"), or learn that a peer
        finished (``ready()`` became true: "ready"), or give up at ``deadline`` ("timeout").

        ``local_lock``: the path of the file lock the caller holds for the same key; a
        holder on this host that held it and died is taken over at once. Redis unreachable
        (or a read_only store, which must not make others wait): "unavailable" at once.
        """
        if self._read_only:
            yield "unavailable"
            return
        lock_key = f"{self._ns}:lock:{name}"
        with redislock.hold(self.call, lock_key, self._lock_ttl_ms, deadline, ready, local_lock) as outcome:
            yield outcome

    # -- counters ----------------------------------------------------------------------------

    def _send_tally(self, tally: dict[str, int]) -> bool:
        if self._health.backing_off():
            return False  # backing off: the tally waits, and is no call the program skipped
        return bool(self.call("count", lambda c: redisfleet.send(c, self._ns, tally)))

    def fleet_stats(self) -> dict[str, Any] | None:
        """Counters of every host sharing this namespace (hits, misses, stores, compiles, seconds
        saved, errors by cause), this process's included; None when Redis cannot be reached."""
        self._stats.flush()
        raw = self.call("read counters", lambda c: c.hgetall(redisfleet.stats_key(self._ns)))
        return None if raw is None else redisfleet.view(raw)

    def fleet_hosts(self) -> dict[str, dict[str, Any]] | None:
        """The fleet counters per host seen within a day (plus ``processes`` and ``last_seen``,
        a Unix time); None when Redis cannot be reached. Totals (fleet_stats) keep every host."""
        self._stats.flush()
        return self.call("read counters", lambda c: redisfleet.read_hosts(c, self._ns))

    def namespace_written(self) -> bool | None:
        """Whether any host ever wrote counters or entries in this namespace; None: unreachable."""
        def written(c: Any) -> bool:
            return bool(c.exists(redisfleet.stats_key(self._ns))) or next(iter(self.scan(c)), None) is not None

        return self.call("read counters", written)

    def zero_stats(self) -> None:
        """Zero this process's counters and, unless read_only, the fleet's counters in Redis."""
        super().zero_stats()
        if not self._read_only:
            self._stats.drop_tally()
            self.call("zero counters", lambda c: redisfleet.zero(c, self._ns))

    def after_fork_in_child(self) -> None:
        """Fresh locks, a client of its own (the parent's pool may be locked by one of its threads,
        the counter sender) and the server judged afresh (a parent's back-off is not the child's)."""
        super().after_fork_in_child()
        self._client_lock, self._health = threading.Lock(), Backoff(self._retry_after)
        self._client = None if self._owns_client else self._client

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["read_only"] = int(self._read_only)
        out["backing_off"] = int(self._health.down_now())
        out["skipped_while_down"] = self._health.skipped
        return out

    def close(self) -> None:
        self._stats.close()
        if self._owns_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
