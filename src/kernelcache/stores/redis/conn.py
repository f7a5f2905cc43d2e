"""Reaching a Redis server: how a client is made (config.urls says which URLs are accepted),
which errors mean "the server cannot be reached" (a back-off) rather than "it answered with
an error"."""

from __future__ import annotations

from typing import Any

from kernelcache.config.urls import check_binary, check_redis_url, require_redis_client


def given_client(url: Any) -> tuple[Any, str]:
    """(the ready client, or None to make one from the URL; how messages name the server) for
    ``url``: a Redis URL str (checked now) or a redis-py client (Redis or RedisCluster)."""
    if isinstance(url, str):
        check_redis_url(url)
        require_redis_client()  # the client itself is imported and connected on the store's first call
        return None, url
    if hasattr(url, "get") and hasattr(url, "set"):
        connection_kwargs = getattr(url, "get_connection_kwargs", None)
        if connection_kwargs is not None:
            check_binary(connection_kwargs(), "this redis client")
        return url, repr(url)
    raise TypeError(f"url must be a redis URL str or a redis-py client, not {type(url).__name__}")


def make_client(url: str, socket_timeout: float) -> Any:
    """A redis-py client for a URL check_redis_url accepted (RedisCluster for ``+cluster``); no I/O yet.

    Called on a store's first call to Redis, not when the store is made: importing redis costs
    more than a hundred hits from a nearer tier. A URL that redis-py refuses where
    check_redis_url did not is an OSError: that tier is then unreachable (warned, backed off).
    """
    import redis

    kw = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    try:
        if url.startswith(("redis+cluster://", "rediss+cluster://")):
            from redis.cluster import RedisCluster

            # Connects at once (it reads the slot map): done on first use, inside RedisProgramCache.call, so
            # a down cluster degrades like a down server instead of raising here.
            return RedisCluster.from_url(url.replace("+cluster", "", 1), **kw)
        return redis.Redis.from_url(url, **kw)
    except ValueError as exc:
        raise OSError(f"redis-py refuses the URL {url!r}: {exc}") from exc


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
