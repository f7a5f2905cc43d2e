"""Reaching an object store through obstore (config.urls says which URLs are accepted): the
bounded timeouts a client gets, and which errors mean "not reached" (back off) rather than
"it answered no"."""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Mapping
from typing import Any

from kernelcache import forksafe

# Bounded by default: obstore's own defaults retry for up to three minutes, which a compile
# waiting on a look-up must never pay. The caller's client_options win over these.
DEFAULT_CLIENT_OPTIONS = {"timeout": "10s", "connect_timeout": "3s"}
_RETRY = {
    "max_retries": 1,
    "backoff": {"init_backoff": datetime.timedelta(milliseconds=100), "max_backoff": datetime.timedelta(seconds=1)},
    "retry_timeout": datetime.timedelta(seconds=10),
}


def get_raw(path: str, local_root: str | None = None) -> Any:
    """fn(store): (bytes, e_tag) of the object at path, or False when there is none.

    ``local_root`` (a file:// store): the directory objects are files of. A FIFO or device
    there is no object: obstore would open it and wait for a writer forever.
    """
    import obstore

    def run(store: Any) -> Any:
        # Race: a FIFO put there between this stat and obstore's open still blocks that one
        # read; the check is for a FIFO that is there, left by a tool or planted by a peer.
        if local_root is not None and not _regular_or_absent(os.path.join(local_root, path)):
            return False
        try:
            got = obstore.get(store, path)
            return bytes(got.bytes()), got.meta.get("e_tag")
        except FileNotFoundError as exc:  # obstore's not-found: a miss
            if no_such_bucket(exc):
                raise  # not a miss of this key: the store says why (call)
            return False

    return run


def _regular_or_absent(file: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(file).st_mode)
    except OSError:
        return True  # absent or unreadable: obstore's own answer decides


def put(path: str, data: bytes, mode: Any) -> Any:
    """fn(store): "written", "exists" (create: already there; update: that version is gone),
    "no-bucket", or "unsupported" (this kind of store cannot replace conditionally)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    def run(store: Any) -> str:
        try:
            obstore.put(store, path, data, mode=mode)
        except (AlreadyExistsError, PreconditionError):
            return "exists"
        except FileNotFoundError:
            # A conditional create of a new object: only the bucket can be missing.
            return "no-bucket" if mode == "create" else "exists"
        except NotImplementedError:
            return "unsupported"
        return "written"

    return run


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


# obstore runs its requests on a runtime of threads started by the first call in a process; a
# child forked after that has the runtime's state but not its threads, and any call there waits
# forever (measured: a GET in such a child never returns; one in a child of a process that made
# no call works). So the stores of such a child make no call (usable_here).
_calls = {"here": False, "before_fork": False}


def note_call() -> None:
    """Before every obstore call of this process (ObjectStoreProgramCache.call makes them all)."""
    _calls["here"] = True


def usable_here() -> bool:
    """Whether obstore may be called in this process (no ancestor called it before forking it)."""
    return not _calls["before_fork"]


def _after_fork_in_child() -> None:
    _calls["before_fork"] = _calls["before_fork"] or _calls["here"]
    _calls["here"] = False


forksafe.reset_function_in_child(_after_fork_in_child)


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
