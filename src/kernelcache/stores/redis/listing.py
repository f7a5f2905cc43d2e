"""What the tools read of a whole Redis namespace: its records (``bundle create``) and their
heads (``ls --redis``, ``stats --redis``).

What a record is (a kernel, a header manifest, a source index) is in its head
(stores/record.py): counting kernels reads each record's first bytes (GETRANGE, pipelined a
batch at a time) and a second range only for a head longer than that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from kernelcache.stores import record as rec
from kernelcache.stores.base import Meta

if TYPE_CHECKING:
    from kernelcache.stores.redis.store import RedisProgramCache

_BATCH = 256
_HEAD_GUESS = 4096

# (entry name, record bytes, created as a Unix time or 0, head or None: not a record of ours)
Head = tuple[str, int, float, "dict[str, Any] | None"]


def _keys(store: RedisProgramCache) -> list[str] | None:
    found = store.call("scan", lambda c: list(store.scan(c)))
    return None if found is None else sorted(k.decode() if isinstance(k, bytes) else str(k) for k in found)


def _heads_of(client: Any, rks: list[str]) -> list[tuple[int, bytes]]:
    pipe = client.pipeline(transaction=False)
    for rk in rks:
        pipe.strlen(rk)
        pipe.getrange(rk, 0, _HEAD_GUESS - 1)
    got = pipe.execute()
    out = [(int(got[i]), bytes(got[i + 1])) for i in range(0, len(got), 2)]
    for i, (size, first) in enumerate(out):
        end = rec.head_end(first[: rec.HEAD_SIZE])
        if end > len(first):  # a long head (a long compile log): the rest of it
            out[i] = (size, first + bytes(client.getrange(rks[i], len(first), end - 1)))
    return out


def heads(store: RedisProgramCache) -> list[Head] | None:
    """(name, bytes, created, head) of every entry of the namespace; None when Redis cannot be
    reached. Heads are not verified (a listing shows, it never serves): a signed namespace lists
    as well without its secret."""
    rks = _keys(store)
    if rks is None:
        return None
    out: list[Head] = []
    for i in range(0, len(rks), _BATCH):
        batch = rks[i : i + _BATCH]
        got = store.call("list", lambda c, batch=batch: _heads_of(c, batch))
        if got is None:
            return None
        for rk, (size, first) in zip(batch, got):
            if size == 0:
                continue  # expired since the scan
            head = rec.peek_head(first)
            created = head.get("created") if head else None
            when = float(created) if isinstance(created, (int, float)) else 0.0
            out.append((rk.rsplit(":", 1)[1], size, when, head))
    return out


def iter_records(
    store: RedisProgramCache, skipped: list[tuple[str, rec.Verdict]] | None = None
) -> Iterator[tuple[str, bytes, Meta, Any]]:
    """(entry name, payload, meta, created) of each entry of the namespace that passes its check
    ((name, why not) of those that do not are added to ``skipped``). ConnectionError when Redis
    cannot be scanned or read: a bundle of part of a namespace must not pass for all of it."""
    rks = _keys(store)
    if rks is None:
        raise ConnectionError(f"Redis at {store.url} could not be scanned ({store.last_error})")
    for rk in rks:
        raw = store.call("read", lambda c, rk=rk: c.get(rk) or b"")  # b"": expired since the scan
        if raw is None:
            raise ConnectionError(f"Redis at {store.url} failed to read {rk} ({store.last_error})")
        verdict, record = store.decode(rk, raw) if raw else (None, None)
        if record is not None:
            yield rk.rsplit(":", 1)[1], record[0], record[1], (rec.peek_head(raw) or {}).get("created")
        elif raw and skipped is not None and verdict is not None:
            skipped.append((rk.rsplit(":", 1)[1], verdict))
