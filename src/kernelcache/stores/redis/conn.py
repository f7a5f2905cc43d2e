"""Reaching a Redis server: which URLs are accepted, how a client is made, which errors mean
"the server cannot be reached" (a back-off) rather than "it answered with an error"."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")


def make_client(url: str, socket_timeout: float) -> Any:
    """A redis-py client for a URL check_url accepted (RedisCluster for ``+cluster``); no I/O yet."""
    import redis

    kw = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        from redis.cluster import RedisCluster

        # Connects at once (it reads the slot map): done on first use, inside RedisProgramCache._call, so a
        # down cluster degrades like a down server instead of raising here.
        return RedisCluster.from_url(url.replace("+cluster", "", 1), **kw)
    return redis.Redis.from_url(url, **kw)


def check_url(url: str) -> None:
    """ValueError naming what is wrong with Redis URL ``url`` (ImportError without redis-py)."""
    from redis.connection import parse_url

    if not url.startswith(SCHEMES):
        raise ValueError(f"Redis URL {url!r} must start with one of {', '.join(SCHEMES)}")
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
    """ValueError if a client made with these connection options would decode answers to str."""
    # A client that decodes answers to str cannot return artifacts (bytes): every hit would
    # raise UnicodeDecodeError. Any value redis-py reads from a URL ("no" included) is true.
    if options.get("decode_responses"):
        raise ValueError(f"{what} has decode_responses set: kernelcache stores bytes, remove it")


def unreachable_errors() -> tuple[type[BaseException], ...]:
    """The redis-py errors that mean the server was not reached (the store then backs off)."""
    import redis.exceptions as e

    return (
        e.ConnectionError,
        e.TimeoutError,
        e.RedisClusterException,
        e.ClusterDownError,
        e.MasterDownError,
        OSError,
    )
