"""Redis URLs are checked without importing redis-py, and refused exactly where redis-py refuses them."""

from __future__ import annotations

import pytest
from helpers import run_python

from kernelcache.config.urls import check_redis_url

URLS = [
    "redis://127.0.0.1:6379/0",
    "redis://h:notaport/0",
    "redis://h:99999/0",
    "redis://user:p%40ss@h:1/2",
    "rediss://h/0?socket_timeout=2.5&ssl_check_hostname=false",
    "redis://h/0?socket_timeout=soon",
    "redis://h/0?max_connections=1.5",
    "redis://h/0?db=x",
    "redis://h/0?protocol=3&health_check_interval=10",
    "redis://h/0?ssl_include_verify_flags=VERIFY_X509_STRICT",
    "redis://h/0?ssl_include_verify_flags=VERIFY_NOTHING_LIKE_IT",
    "redis://h/0?unknown_option=kept",
    "unix:///run/redis.sock?db=3",
    "http://h:6379/0",
]


@pytest.mark.parametrize("url", URLS)
def test_refused_exactly_where_redis_py_refuses(url: str) -> None:
    """Each URL: our check raises ValueError if and only if redis-py's parse_url does."""
    connection = pytest.importorskip("redis.connection", reason="the redis client is the 'redis' extra")
    try:
        connection.parse_url(url)
        theirs = None
    except ValueError as exc:
        theirs = exc
    try:
        check_redis_url(url)
        ours = None
    except ValueError as exc:
        ours = exc
    assert (ours is None) == (theirs is None), (ours, theirs)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://h:1/cache", "'cache'"),  # redis-py takes it as database 0, in silence
        ("redis://h:1/0?decode_responses=True", "decode_responses"),
        ("redis+cluster://h:1/2", "only database 0"),
        ("unix://", "names no socket"),
    ],
)
def test_what_redis_py_serves_badly_is_refused_too(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_redis_url(url)


def test_checking_a_url_imports_no_redis_client() -> None:
    """A fresh process checks a URL with redis-py installed and never imports it."""
    code = (
        "import sys\nfrom kernelcache.config.urls import check_redis_url\n"
        "check_redis_url('redis://127.0.0.1:6379/0?socket_timeout=1')\n"
        "print(any(m == 'redis' or m.startswith('redis.') for m in sys.modules))\n"
    )
    assert run_python(code).strip() == "False"
