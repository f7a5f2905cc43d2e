"""Reaching an object store through obstore (config.urls says which URLs are accepted): the
bounded timeouts a client gets, and which errors mean "not reached" (back off) rather than
"it answered no"."""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from typing import Any

# Bounded by default: obstore's own defaults retry for up to three minutes, which a compile
# waiting on a look-up must never pay. The caller's client_options win over these.
DEFAULT_CLIENT_OPTIONS = {"timeout": "10s", "connect_timeout": "3s"}
_RETRY = {
    "max_retries": 1,
    "backoff": {"init_backoff": datetime.timedelta(milliseconds=100), "max_backoff": datetime.timedelta(seconds=1)},
    "retry_timeout": datetime.timedelta(seconds=10),
}


def make_store(url: str, client_options: Mapping[str, Any] | None) -> Any:
    """An obstore store for ``url`` (credentials from the environment, as obstore and each
    cloud's tools take them); ImportError naming the extra when obstore is missing."""
    try:
        from obstore.store import from_url
    except ImportError as exc:
        raise ImportError(f"ObjectStoreProgramCache needs obstore ({exc}): pip install 'kernelcache[s3]'") from None
    if url.startswith("memory://"):
        return from_url(url)
    if url.startswith("file://"):
        return from_url(url, mkdir=True)
    options = {**DEFAULT_CLIENT_OPTIONS, **_client_options_from_env(url), **dict(client_options or {})}
    return from_url(url, client_options=options, retry_config=_RETRY)


# obstore's HTTP client options, which its builders also read from the environment
# (AWS_ALLOW_HTTP, GOOGLE_PROXY_URL...), except when client options are passed: these are
# passed (the bounded timeouts), so the environment's are read here the same way.
_CLIENT_KEYS = (
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "timeout",
    "user_agent",
)
_ENV_PREFIX = {"s3": "AWS_", "s3a": "AWS_", "gs": "GOOGLE_"}


def _client_options_from_env(url: str) -> dict[str, str]:
    prefix = _ENV_PREFIX.get(url.split("://", 1)[0], "AZURE_")
    return {key: os.environ[prefix + key.upper()] for key in _CLIENT_KEYS if os.environ.get(prefix + key.upper())}


def listing(store: Any, prefix: str) -> Any:
    """obstore's listing of ``prefix`` (batches of rows)."""
    import obstore

    return obstore.list(store, prefix)


def errors() -> Any:
    """obstore's exception module (imported where obstore is known to be present)."""
    import obstore.exceptions

    return obstore.exceptions


def answered(exc: BaseException) -> bool:
    """Whether the store answered (a refusal: permissions, credentials) rather than was not reached.

    A refusal is not an outage: that one call fails and the next is tried. So is a bucket that
    does not exist and an http endpoint obstore will not use (no request was sent: nothing is
    down). Anything else (a connection refused, a timeout, a 5xx answered to every request) is
    treated as down.
    """
    e = errors()
    kinds = (e.PermissionDeniedError, e.UnauthenticatedError, e.NotSupportedError)
    return isinstance(exc, kinds) or no_such_bucket(exc) or plain_http(exc)


def no_such_bucket(exc: BaseException) -> bool:
    """Whether the store answered that the bucket (or container) does not exist."""
    text = str(exc)
    return "NoSuchBucket" in text or "ContainerNotFound" in text or "bucket does not exist" in text


def plain_http(exc: BaseException) -> bool:
    """Whether obstore refused to send a request to an http endpoint (no ``allow_http``)."""
    return "BadScheme" in str(exc)


def explain(exc: BaseException, url: str) -> str:
    """One line saying why a call failed, its cause first: obstore's own message puts it at the
    end of a long text (a plain-http endpoint says ``BadScheme`` only in its debug dump)."""
    text = str(exc)
    if plain_http(exc):
        scheme = url.split("://", 1)[0]
        variable = {"s3": "AWS_ALLOW_HTTP", "s3a": "AWS_ALLOW_HTTP", "gs": "GOOGLE_ALLOW_HTTP"}.get(scheme)
        how = f"{variable}=true" if variable else "AZURE_ALLOW_HTTP=true"
        return f"its endpoint is plain http, which obstore refuses unless told: set {how} (or allow_http)"
    if no_such_bucket(exc):
        return f"the bucket or container of {url} does not exist"
    first = text.splitlines()[0] if text else ""
    for marker in ("Server returned non-2xx status code: ", "HTTP error: ", "error: "):
        if marker in first:  # the cause is after the request it failed (the URL, the time it took)
            first = first.split(marker, 1)[1]
            break
    return f"{type(exc).__name__}: {first[:200]}"
