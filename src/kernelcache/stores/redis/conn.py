"""Reaching a Redis server: how a client is made (config.urls says which URLs are accepted), which errors mean
"the server cannot be reached" (a back-off) rather than "it answered with an error"."""

from __future__ import annotations

from typing import Any


def make_client(url: str, socket_timeout: float) -> Any:
    """A redis-py client for a URL check_redis_url accepted (RedisCluster for ``+cluster``); no I/O yet."""
    import redis

    kw = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    if url.startswith(("redis+cluster://", "rediss+cluster://")):
        from redis.cluster import RedisCluster

        # Connects at once (it reads the slot map): done on first use, inside RedisProgramCache._call, so a
        # down cluster degrades like a down server instead of raising here.
        return RedisCluster.from_url(url.replace("+cluster", "", 1), **kw)
    return redis.Redis.from_url(url, **kw)


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
