"""Which Redis and object-store URLs kernelcache accepts: pure checks, no connection made.

The environment's ``KERNELCACHE_REDIS_URL`` / ``KERNELCACHE_OBJECT_STORE_URL`` and the stores'
own ``url=`` arguments are checked by these same functions, so a URL is accepted or refused
the same way wherever it is given.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
OBJECT_STORE_SCHEMES = (
    "s3://",
    "s3a://",
    "gs://",
    "az://",
    "azure://",
    "abfs://",
    "abfss://",
    "adl://",
    "file://",
    "memory://",
)


def check_redis_url(url: str) -> None:
    """ValueError naming what is wrong with Redis URL ``url`` (ImportError without redis-py)."""
    from redis.connection import parse_url

    if not url.startswith(REDIS_SCHEMES):
        raise ValueError(f"Redis URL {url!r} must start with one of {', '.join(REDIS_SCHEMES)}")
    plain = url.replace("+cluster", "", 1)
    if plain.startswith("unix://"):
        where = urlsplit(plain)
        if where.netloc or where.path in ("", "/"):
            # redis-py would drop a host and connect to "" or "/": a back-off at every call.
            raise ValueError(
                f"Redis URL {url!r} names no socket: write the socket's absolute path, unix:///run/redis/redis.sock"
            )
    options = parse_url(plain)  # a malformed port or query value raises ValueError now
    # redis-py silently ignores a database that is not a number (redis://host/cache is db 0).
    db = urlsplit(plain).path.strip("/") if not plain.startswith("unix://") else ""
    if db and not db.isdigit():
        raise ValueError(f"the database {db!r} in Redis URL {url!r} is not a number (redis://host:port/0)")
    if plain != url and int(options.get("db") or 0) != 0:
        # Redis Cluster has database 0 only: the client would refuse it at every call, which
        # reads as "Redis unreachable" (a miss and a back-off) instead of a bad URL.
        raise ValueError(f"Redis URL {url!r}: Redis Cluster has only database 0")
    check_binary(options, f"Redis URL {url!r}")


def check_binary(options: dict[str, Any], what: str) -> None:
    """ValueError if a Redis client made with these connection options would decode answers to str."""
    # A client that decodes answers to str cannot return artifacts (bytes): every hit would
    # raise UnicodeDecodeError. Any value redis-py reads from a URL ("no" included) is true.
    if options.get("decode_responses"):
        raise ValueError(f"{what} has decode_responses set: kernelcache stores bytes, remove it")


def check_object_store_url(url: object) -> str:
    """``url`` if it names a bucket or container obstore can open; ValueError/TypeError naming the forms."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str like 's3://bucket/path', not {type(url).__name__}")
    bare = {s.rstrip("/") for s in OBJECT_STORE_SCHEMES if s != "memory://"}
    if not url.startswith(OBJECT_STORE_SCHEMES) or url.rstrip("/") in bare:
        raise ValueError(
            f"object store URL {url!r}: use s3://bucket/path, gs://bucket/path, az://container/path, "
            "file:///directory or memory:///"
        )
    return url
