"""What the tools read of a whole bucket: its records (``bundle create``) and their heads (``ls``,
``stats``), a batch at a time so that a bucket larger than memory is fine.

A listing names objects; what an object is (a kernel, a header manifest, a source index) is in
its record's head (stores/record.py), so counting kernels reads each head: a ranged GET of the
record's first bytes, and a second one only for a head longer than that (a long compile log).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from kernelcache.stores import record as rec
from kernelcache.stores.base import Meta

if TYPE_CHECKING:
    from kernelcache.stores.object.store import ObjectStoreProgramCache

MAX_PARALLEL_GETS = 16
_HEAD_GUESS = 4096  # bytes of a record read first: the fixed part and most heads

# (entry name, record bytes, last modified as a Unix time, head or None: not a record of ours)
Head = tuple[str, int, float, "dict[str, Any] | None"]


def _path_of(row: Any) -> str:
    return str(row["path"])


def rows(store: ObjectStoreProgramCache) -> list[Any] | None:
    """The listing rows of every entry under the store's prefix, by path; None: not reached."""
    import obstore

    prefix = store.entries_prefix

    def listing(client: Any) -> list[Any]:
        return sorted((m for batch in obstore.list(client, prefix) for m in batch), key=_path_of)

    return store.call("list", listing)


def _in_batches(listed: list[Any], read: Callable[[str], Any]) -> Iterator[Any]:
    """read(path) of each row, MAX_PARALLEL_GETS at once and in order."""
    with ThreadPoolExecutor(max_workers=MAX_PARALLEL_GETS) as pool:
        for i in range(0, len(listed), MAX_PARALLEL_GETS):
            yield from pool.map(read, [_path_of(m) for m in listed[i : i + MAX_PARALLEL_GETS]])


def _head_of(path: str) -> Callable[[Any], Any]:
    """fn(client): the record's head at ``path`` (unverified: for listings), None if not ours,
    False when the object went meanwhile."""
    import obstore

    def run(client: Any) -> Any:
        try:
            first = bytes(obstore.get_range(client, path, start=0, length=_HEAD_GUESS))
            end = rec.head_end(first[: rec.HEAD_SIZE])
            if end > len(first):
                first += bytes(obstore.get_range(client, path, start=len(first), length=end - len(first)))
        except FileNotFoundError:
            return False
        except ValueError:  # a range past the end of a short object
            return None
        return rec.peek_head(first)

    return run


def heads(store: ObjectStoreProgramCache) -> list[Head] | None:
    """(name, bytes, last modified, head) of every entry; None when the store cannot be reached.

    Heads are not verified (a listing shows, it never serves): a signed bucket lists as well
    without its secret."""
    listed = rows(store)
    if listed is None:
        return None
    found = _in_batches(listed, lambda path: store.call("list", _head_of(path)))
    out = []
    for m, head in zip(listed, found):
        if head is not False:
            out.append((_path_of(m).rsplit("/", 1)[-1], int(m["size"]), m["last_modified"].timestamp(), head or None))
    return out


def iter_records(
    store: ObjectStoreProgramCache, skipped: list[tuple[str, rec.Verdict]] | None = None
) -> Iterator[tuple[str, bytes, Meta, Any]]:
    """(entry name, payload, meta, created) of each entry that passes its check (bundle create);
    (name, why not) of those that do not are added to ``skipped``. ConnectionError when the store
    cannot be listed or read: a bundle of part of a bucket must not pass for all of it."""
    listed = rows(store)
    if listed is None:
        raise ConnectionError(f"the object store {store.url} could not be listed ({store.last_error})")
    for m, found in zip(listed, _in_batches(listed, store.get_raw)):
        path, name = _path_of(m), _path_of(m).rsplit("/", 1)[-1]
        if found is None:
            raise ConnectionError(f"the object store {store.url} failed to read {path} ({store.last_error})")
        if found is False:
            continue  # removed since the listing (a lifecycle rule)
        verdict, record = store.decode(path, found[0])
        if record is not None:
            yield name, record[0], record[1], m["last_modified"].timestamp()
        elif skipped is not None:
            skipped.append((name, verdict))
