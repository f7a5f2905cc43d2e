"""Which Redis and object-store URLs and OCI references kernelcache accepts: pure checks, no connection made.

The environment's ``KERNELCACHE_REDIS_URL`` / ``KERNELCACHE_OBJECT_STORE_URL`` and the stores'
own ``url=`` arguments are checked by these same functions, so a URL is accepted or refused
the same way wherever it is given.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

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


# The query arguments redis-py's parse_url converts, by how (redis-py 5-7); a value it cannot
# convert is a ValueError there, and here, without importing redis (120 ms: a hit from disk
# must not wait for it). Any other argument is passed on as a str.
_QUERY_NUMBERS = {
    "db": int,
    "socket_timeout": float,
    "socket_connect_timeout": float,
    "socket_read_size": int,
    "max_connections": int,
    "health_check_interval": int,
    "ssl_min_version": int,
    "timeout": float,
    "protocol": int,
}


def check_redis_url(url: str) -> None:
    """ValueError naming what is wrong with Redis URL ``url``; imports nothing (redis-py included).

    What redis-py's own parse_url refuses (a scheme, a port, a query value it cannot convert)
    is refused here in its terms; what it accepts in silence but serves badly too (a database
    that is not a number, a decoding client). The client itself is made on first use
    (stores.redis.conn), by redis-py, from the same URL.
    """
    if not url.startswith(REDIS_SCHEMES):
        raise ValueError(f"Redis URL {url!r} must start with one of {', '.join(REDIS_SCHEMES)}")
    plain = url.replace("+cluster", "", 1)
    where = urlsplit(plain)
    if plain.startswith("unix://"):
        if where.netloc or where.path in ("", "/"):
            # redis-py would drop a host and connect to "" or "/": a back-off at every call.
            raise ValueError(
                f"Redis URL {url!r} names no socket: write the socket's absolute path, unix:///run/redis/redis.sock"
            )
    else:
        try:
            where.port  # noqa: B018 - raises ValueError for a port that is not a number in range
        except ValueError as exc:
            raise ValueError(f"Redis URL {url!r}: {exc}") from None
    options: dict[str, Any] = {}
    for name, values in parse_qs(where.query).items():
        options[name] = values[0]
        convert = _QUERY_NUMBERS.get(name)
        if convert is not None:
            try:
                options[name] = convert(values[0])
            except ValueError:
                raise ValueError(f"Invalid value for '{name}' in connection URL {url!r}.") from None
        elif name in ("ssl_include_verify_flags", "ssl_exclude_verify_flags"):
            import ssl  # redis-py's names: ssl.VerifyFlags members, a comma-separated list

            flags = [flag.strip() for flag in values[0].replace("[", "").replace("]", "").split(",")]
            for flag in flags:
                if not hasattr(ssl.VerifyFlags, flag):
                    raise ValueError(f"Invalid ssl verify flag: {flag} in connection URL {url!r}")
    # redis-py silently ignores a database that is not a number (redis://host/cache is db 0).
    db = where.path.strip("/") if not plain.startswith("unix://") else ""
    if db and not db.isdigit():
        raise ValueError(f"the database {db!r} in Redis URL {url!r} is not a number (redis://host:port/0)")
    if plain != url and int(options.get("db") or db or 0) != 0:
        # Redis Cluster has database 0 only: the client would refuse it at every call, which
        # reads as "Redis unreachable" (a miss and a back-off) instead of a bad URL.
        raise ValueError(f"Redis URL {url!r}: Redis Cluster has only database 0")
    check_binary(options, f"Redis URL {url!r}")


def require_redis_client() -> None:
    """ImportError naming the extra when redis-py is not installed. The import system's look-up
    only: nothing is imported (redis costs ~120 ms), so every place that must know it asks here,
    the default cache when KERNELCACHE_REDIS_URL is set as much as RedisProgramCache."""
    import importlib.util

    if importlib.util.find_spec("redis") is None:
        raise ImportError("the redis client (redis-py) is missing: pip install 'kernelcache[redis]'")


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


OCI_SCHEME = "oci://"
# The OCI distribution spec's grammar: a repository is path components of lowercase
# alphanumerics joined by separators; a tag is at most 128 word characters, dots and dashes.
# Patterns, compiled by re (and kept in its cache) when an OCI reference is first checked, not at import.
_OCI_REPO = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*"
_OCI_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_OCI_DIGEST = r"sha256:[a-f0-9]{64}"
_OCI_HOST = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"


class OciReference(NamedTuple):
    """``oci://REGISTRY/REPO:TAG`` or ``oci://REGISTRY/REPO@sha256:HEX`` (or both), parsed. (A
    NamedTuple: a frozen dataclass costs half a millisecond to make, in the first hit of a
    process whose default cache has a Redis tier.)"""

    registry: str  # host[:port], as written
    repository: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{OCI_SCHEME}{self.registry}/{self.repository}{tag}{digest}"


def oci_reference(text: str) -> OciReference:
    """``text`` (``oci://REGISTRY/REPO:TAG``, ``...@sha256:HEX``) parsed; ValueError naming the form.

    The registry is always written out (no default registry: ``oci://docker.io/team/kernels:v1``
    for Docker Hub); a tag or a digest is required (no implicit ``latest``)."""
    if not isinstance(text, str) or not text.startswith(OCI_SCHEME):
        raise ValueError(f"{text!r} is not an OCI reference: write oci://REGISTRY/REPO:TAG")
    rest = text[len(OCI_SCHEME) :]
    rest, _, digest = rest.partition("@")
    registry, _, path = rest.partition("/")
    repo, tag = path, ""
    if ":" in path.rsplit("/", 1)[-1]:
        repo, _, tag = path.rpartition(":")
    problems = []
    if not re.fullmatch(_OCI_HOST, registry):
        problems.append(f"{registry!r} is not a registry host[:port]")
    if not re.fullmatch(_OCI_REPO, repo):
        problems.append(f"{repo!r} is not a repository (lowercase path components, e.g. team/kernels)")
    if tag and not re.fullmatch(_OCI_TAG, tag):
        problems.append(f"{tag!r} is not a tag (letters, digits, _ . -; at most 128)")
    if digest and not re.fullmatch(_OCI_DIGEST, digest):
        problems.append(f"{digest!r} is not a digest (sha256: and 64 lowercase hex digits)")
    if not tag and not digest:
        problems.append("it names no tag or digest (...:TAG or ...@sha256:HEX)")
    if problems:
        raise ValueError(f"OCI reference {text!r}: " + "; ".join(problems))
    return OciReference(registry, repo, tag or None, digest or None)


def split_bundle_list(raw: str, sep: str) -> list[str]:
    """KERNELCACHE_BUNDLES split at ``sep`` (os.pathsep), keeping each ``oci://`` reference whole.

    An OCI reference holds colons of its own (a port, a tag, ``sha256:``): after ``oci`` +
    ``//...``, every piece that does not start a path (``/`` or ``~``) or another reference belongs to it. File
    entries must be absolute paths, so the split is never ambiguous for a valid value.
    """
    pieces = raw.split(sep)

    def starts_ref(i: int) -> bool:
        return sep == ":" and pieces[i] == "oci" and i + 1 < len(pieces) and pieces[i + 1].startswith("//")

    out: list[str] = []
    i = 0
    while i < len(pieces):
        if starts_ref(i):
            ref, i = pieces[i] + sep + pieces[i + 1], i + 2
            while i < len(pieces) and pieces[i] and not pieces[i].startswith(("/", "~")) and not starts_ref(i):
                ref, i = ref + sep + pieces[i], i + 1
            out.append(ref)
        else:
            out.append(pieces[i])
            i += 1
    return out
