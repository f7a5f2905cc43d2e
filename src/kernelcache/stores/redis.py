"""RedisProgramCache: a shared tier on a real Redis server (single server or Redis Cluster).

One Redis string per entry, ``<namespace>:e:<key hex>``, holding a record that carries the
artifact, its digest and its metadata together, so a reader can never pair one writer's
bytes with another's metadata::

    b"KCR1" | u32 meta length | meta JSON (size, sha256, created, meta) | payload | [HMAC-SHA256]

With ``secret=`` every record is signed (HMAC over namespace, key and record); an unsigned or
mis-signed record is a miss with a warning, so a writer without the secret cannot make other
users run its code. A failing server (down, refusing, slow, out of memory) costs at most one
socket timeout per call: the call is a miss or a dropped write, counted, warned about once;
after repeated failures the store stops trying for a back-off period.

Single flight across machines: ``remote_lock`` takes ``<namespace>:lock:<key hex>`` with
SET NX and an expiry, refreshed while its holder compiles; a holder that dies releases it by
expiry.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from kernelcache.stores.base import Meta, RecordStore, check_max_size
from kernelcache.stores.naming import entry_name

_MAGIC = b"KCR1"
_LEN = struct.Struct("<I")
_MAC_SIZE = 32
DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MAX_ENTRY_BYTES = 64 * 1024 * 1024
# Consecutive failures before the store stops calling Redis, and for how long (doubling up
# to the cap while the server stays unreachable).
_FAILURES_BEFORE_BACKOFF = 3
_BACKOFF_S = 5.0
_BACKOFF_CAP_S = 300.0
_LOCK_TTL_MS = 30_000
_RELEASE_LUA = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_REFRESH_LUA = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)


def _make_client(url: str, socket_timeout: float) -> Any:
    import redis

    kw = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        from redis.cluster import RedisCluster

        plain = url.replace("+cluster", "", 1)
        return RedisCluster.from_url(plain, **kw)
    return redis.Redis.from_url(url, **kw)


class RedisProgramCache(RecordStore):
    """A ProgramCacheResource on Redis, shared by every machine that can reach the server.

    ``url``: ``redis://host:port/db``, ``rediss://`` (TLS), ``redis+cluster://host:port`` for
    Redis Cluster, or a ready redis-py client (Redis or RedisCluster). ``namespace`` prefixes
    every key; ``len()`` and ``clear()`` touch this namespace only. ``ttl`` (seconds) expires
    entries; entries over ``max_entry_bytes`` are skipped with a warning. ``secret`` (bytes or
    str) signs and verifies entries. ``read_only=True`` never writes. ``socket_timeout`` bounds
    every call; after 3 failures in a row the store skips Redis for ``retry_after_s`` (doubling
    while it stays down, up to 5 minutes). ``lock_ttl_s``: expiry of single-flight locks.
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
        lock_ttl_s: float = _LOCK_TTL_MS / 1000,
    ) -> None:
        super().__init__()
        if not isinstance(namespace, str) or not namespace:
            raise ValueError("namespace must be a non-empty str")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0):
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        for label, value in (
            ("socket_timeout", socket_timeout),
            ("retry_after_s", retry_after_s),
            ("lock_ttl_s", lock_ttl_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{label} must be a positive number of seconds, got {value!r}")
        self._retry_after = float(retry_after_s)
        self._lock_ttl_ms = int(lock_ttl_s * 1000)
        self._max_entry = check_max_size(max_entry_bytes)
        if isinstance(secret, str):
            secret = secret.encode()
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise ValueError("secret must be non-empty bytes or str, or None")
        self._secret = secret
        self._ns = namespace
        self._ttl_ms = int(ttl * 1000) if ttl is not None else None
        self._read_only = bool(read_only)
        if isinstance(url, str):
            self._client = _make_client(url, socket_timeout)
            self._owns_client = True
            self.url = url
        elif hasattr(url, "get") and hasattr(url, "set"):
            self._client = url
            self._owns_client = False
            self.url = repr(url)
        else:
            raise TypeError(f"url must be a redis URL str or a redis-py client, not {type(url).__name__}")
        self._health_lock = threading.Lock()
        self._failures = 0
        self._down_until = 0.0
        self._backoff = self._retry_after

    @property
    def read_only(self) -> bool:
        return self._read_only

    # -- keys and records ------------------------------------------------------------------

    def _entry_key(self, key: bytes) -> str:
        return f"{self._ns}:e:{entry_name(key)}"

    def _mac(self, redis_key: str, body: bytes) -> bytes:
        assert self._secret is not None
        return hmac.new(self._secret, redis_key.encode() + b"\0" + body, hashlib.sha256).digest()

    def _encode(self, redis_key: str, payload: bytes, meta: Meta) -> bytes:
        head = json.dumps(
            {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest(), "created": time.time(), "meta": meta},
            separators=(",", ":"),
        ).encode()
        body = _MAGIC + _LEN.pack(len(head)) + head + payload
        return body + self._mac(redis_key, body) if self._secret is not None else body

    def _decode(self, redis_key: str, raw: bytes) -> tuple[bytes, Meta] | None:
        body = raw
        if self._secret is not None:
            body, mac = raw[:-_MAC_SIZE], raw[-_MAC_SIZE:]
            if len(raw) < _MAC_SIZE or not hmac.compare_digest(mac, self._mac(redis_key, body)):
                self.warn_once(
                    "unsigned",
                    f"Redis entry {redis_key} is unsigned or signed with another secret; ignored (a miss)",
                )
                return None
        try:
            if body[:4] != _MAGIC:
                raise ValueError("bad magic")
            (n,) = _LEN.unpack_from(body, 4)
            head = json.loads(body[8 : 8 + n])
            payload = body[8 + n :]
            if head["size"] != len(payload) or head["sha256"] != hashlib.sha256(payload).hexdigest():
                raise ValueError("digest mismatch")
        except (ValueError, KeyError, struct.error, TypeError):
            self.warn_once("corrupt", f"Redis entry {redis_key} is corrupt; ignored (a miss) and removed")
            self._call("delete", lambda c: c.delete(redis_key))
            return None
        meta = head.get("meta")
        return payload, meta if isinstance(meta, dict) else {}

    # -- calling Redis safely ----------------------------------------------------------------

    def _call(self, what: str, fn: Any) -> Any:
        """Run fn(client); on any Redis/socket failure return None (warned, counted, backed off)."""
        import redis

        with self._health_lock:
            if self._down_until and time.monotonic() < self._down_until:
                self._stats.add(errors=1)
                return None
        try:
            result = fn(self._client)
        except (redis.exceptions.RedisError, OSError) as exc:
            self._failed(what, exc)
            return None
        with self._health_lock:
            self._failures = 0
            self._down_until = 0.0
            self._backoff = self._retry_after
        return result

    def _failed(self, what: str, exc: BaseException) -> None:
        with self._health_lock:
            self._failures += 1
            if self._failures >= _FAILURES_BEFORE_BACKOFF:
                # Stop paying a socket timeout on every call while the server is unreachable.
                self._down_until = time.monotonic() + self._backoff
                self._backoff = min(self._backoff * 2, _BACKOFF_CAP_S)
        kind = type(exc).__name__
        self.warn_once(
            f"{what}-{kind}",
            f"Redis at {self.url} failed to {what} ({kind}: {str(exc)[:120]}); treated as a miss / dropped "
            f"write (compiles still work); after {_FAILURES_BEFORE_BACKOFF} failures in a row it is skipped for "
            "a while",
        )

    # -- the store -------------------------------------------------------------------------

    def _read(self, key: bytes, want_meta: bool = True) -> tuple[bytes, Meta] | None:
        rk = self._entry_key(key)
        raw = self._call("read", lambda c: c.get(rk))
        if raw is None:
            return None
        return self._decode(rk, raw)

    def _write(self, key: bytes, payload: bytes, meta: Meta) -> bool:
        if self._read_only:
            return False  # a consumer: never writes (by choice, not an error)
        if self._max_entry is not None and len(payload) > self._max_entry:
            self.warn_once(
                "too-large", f"an entry of {len(payload)} bytes exceeds max_entry_bytes={self._max_entry}; not stored"
            )
            return False
        rk = self._entry_key(key)
        record = self._encode(rk, payload, meta)
        ok = self._call("write", lambda c: c.set(rk, record, px=self._ttl_ms))
        return bool(ok)

    def _remove(self, key: bytes) -> bool:
        self._check_writable("delete entries")
        rk = self._entry_key(key)
        return bool(self._call("delete", lambda c: c.delete(rk)))

    def _check_writable(self, what: str) -> None:
        if self._read_only:
            raise PermissionError(f"this RedisProgramCache is read_only=True: it does not {what}")

    def _scan(self) -> Iterator[Any]:
        return self._client.scan_iter(match=f"{self._ns}:e:*", count=1000)

    def __len__(self) -> int:
        found = self._call("count", lambda c: sum(1 for _ in self._scan()))
        return int(found or 0)

    def clear(self) -> None:
        """Remove this namespace's entries (SCAN + UNLINK: no KEYS, no FLUSHDB)."""
        self._check_writable("clear")

        def unlink_all(c: Any) -> int:
            batch: list[Any] = []
            removed = 0
            for k in self._scan():
                batch.append(k)
                if len(batch) >= 500:
                    removed += sum(c.unlink(x) for x in batch)  # one key per call: cluster-safe
                    batch.clear()
            removed += sum(c.unlink(x) for x in batch)
            return removed

        self._call("clear", unlink_all)

    # -- single flight across machines ---------------------------------------------------------

    @contextlib.contextmanager
    def remote_lock(self, name: str, deadline: float, ready: Any) -> Iterator[str]:
        """Hold the cluster-wide lock ``name`` (yields "acquired"), or learn that a peer
        finished (``ready()`` became true: "ready"), or give up at ``deadline`` ("timeout").

        Redis unreachable: yields "unavailable" at once (the caller compiles on its own).
        """
        if self._read_only:
            yield "unavailable"  # a consumer never publishes, so it must not make others wait
            return
        lock_key = f"{self._ns}:lock:{name}"
        token = uuid.uuid4().hex
        while True:
            # bool(): redis-py answers None both for "NX: already set" and (via _call) for a
            # failure; False now means "held by a peer", None "Redis unreachable".
            got = self._call("lock", lambda c: bool(c.set(lock_key, token, nx=True, px=self._lock_ttl_ms)))
            if got:
                break
            if got is None:
                yield "unavailable"
                return
            if ready():
                yield "ready"
                return
            if time.monotonic() >= deadline:
                yield "timeout"
                return
            time.sleep(0.05)
        stop = threading.Event()
        refresher = threading.Thread(target=self._refresh, args=(lock_key, token, stop), daemon=True)
        refresher.start()
        try:
            yield "acquired"
        finally:
            stop.set()
            refresher.join(timeout=5)
            self._call("unlock", lambda c: c.eval(_RELEASE_LUA, 1, lock_key, token))

    def _refresh(self, lock_key: str, token: str, stop: threading.Event) -> None:
        # Extend the lock while its holder compiles; if this process dies, the refreshes
        # stop and the lock expires within _LOCK_TTL_MS, letting a waiter take over.
        while not stop.wait(self._lock_ttl_ms / 3000):
            self._call("refresh lock", lambda c: c.eval(_REFRESH_LUA, 1, lock_key, token, self._lock_ttl_ms))

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        out["read_only"] = int(self._read_only)
        out["backing_off"] = int(bool(self._down_until and time.monotonic() < self._down_until))
        return out

    def close(self) -> None:
        if self._owns_client:
            with contextlib.suppress(Exception):
                self._client.close()
