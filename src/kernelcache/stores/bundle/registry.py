"""One OCI registry, reached through the distribution API with the standard library (urllib).

What it answers (the OCI distribution spec's token and basic schemes, as Docker's client does):

- every request goes out anonymous, or with what an earlier challenge asked for; a 401 names
  the scheme in ``WWW-Authenticate``. ``Bearer realm=...,service=...,scope=...``: a token is
  fetched from the realm (with basic credentials when there are any; an identity token from
  ``docker login`` is exchanged with OAuth2's refresh-token grant) and kept per scope for this
  object's life. ``Basic``: the credentials, if any. The request is then sent once more.
- credentials (``credentials_for``): ``KERNELCACHE_OCI_TOKEN`` (a registry token, sent as a
  bearer token as it is), else ``KERNELCACHE_OCI_USERNAME`` + ``KERNELCACHE_OCI_PASSWORD``, else
  the docker config's entry for the registry (``$DOCKER_CONFIG/config.json``, else
  ``~/.docker/config.json``: ``auths`` with ``auth`` or ``identitytoken``, ``credHelpers`` and
  ``credsStore`` through their ``docker-credential-NAME get``). The environment's credentials are
  given to any registry that asks for them; per-registry credentials belong in the docker config.
- transport: https, verified against the system's CAs (``SSL_CERT_FILE``/``SSL_CERT_DIR`` add
  others); plain http only to a loopback host that does not speak TLS (a certificate that fails
  its check is an error there too, never a fall-back). Credentials never go over plain http to
  another host. A redirect (blob downloads are often sent to object storage) does not carry the
  Authorization header (urllib's unredirected headers): storage signs its own URLs.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import re
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import Any

from kernelcache import config
from kernelcache.regular_file import open_regular

# Docker Hub's API lives on another host than the name users write (docker.io).
_API_HOSTS = {"docker.io": "registry-1.docker.io", "index.docker.io": "registry-1.docker.io"}
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
_MAX_SMALL_BODY = 1 << 20  # a token answer or an error body: read at most this much


class RegistryError(OSError):
    """The registry could not be reached, refused the request, or asked for credentials we lack."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Credentials:
    """What answers a registry's challenge: a token as is, basic credentials, or an identity token."""

    username: str | None = None
    password: str | None = None
    token: str | None = None
    identity_token: str | None = None
    source: str = "none"

    @property
    def basic(self) -> str | None:
        if self.username is None or self.password is None:
            return None
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def is_loopback(host: str) -> bool:
    """Whether ``host`` (``host[:port]``, ``[v6]:port``) is this machine: localhost or 127/8, ::1."""
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.endswith("]") or "]:" in host else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Registry:
    """Requests to one registry host (``host[:port]``), authenticated as its challenges ask."""

    def __init__(self, host: str, *, timeout: float = 60.0, credentials: Credentials | None = None) -> None:
        self.host = host
        self.api_host = _API_HOSTS.get(host, host)
        self.timeout = timeout
        self._credentials = credentials
        self._loopback = is_loopback(self.api_host)
        self._scheme: str | None = None if self._loopback else "https"
        self._auth: dict[str, str] = {}  # scope -> Authorization header value
        self._opener = urllib.request.build_opener()

    @property
    def credentials(self) -> Credentials:
        if self._credentials is None:
            self._credentials = credentials_for(self.host)
        return self._credentials

    def url(self, path: str) -> str:
        return f"{self._scheme or 'https'}://{self.api_host}{path}"

    def open(
        self,
        method: str,
        path: str,
        scope: str,
        *,
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> HTTPResponse:
        """The (2xx) response to ``method path`` on this registry; RegistryError otherwise.

        ``path`` is the API path (``/v2/...``) or a URL the registry gave (an upload's Location).
        A 401 is answered once (its challenge); ``data`` (bytes or a seekable file) is sent
        again then. ``scope`` is the token scope the request needs (``repository:R:pull``)."""
        answered = False
        while True:
            target = path if "://" in path else self.url(path)
            request = urllib.request.Request(target, data=data, method=method, headers=headers or {})
            # The registry's own credentials go to its own host only (an upload may be sent elsewhere).
            if scope in self._auth and urllib.parse.urlsplit(target).netloc == self.api_host:
                request.add_unredirected_header("Authorization", self._auth[scope])
            try:
                response: HTTPResponse = self._opener.open(request, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                self._scheme = self._scheme or "https"
                challenge = exc.headers.get("WWW-Authenticate", "")
                body = _small_body(exc)
                # One answer per request: a second 401 means the credentials are refused.
                if exc.code == 401 and not answered and self._answer(challenge, scope):
                    answered = True
                    _rewind(data)
                    continue
                raise RegistryError(self._refusal(method, path, exc.code, body, answered), exc.code) from None
            except urllib.error.URLError as exc:
                if self._scheme is None and _not_tls(exc.reason):
                    self._scheme = "http"  # a loopback registry without TLS (Docker's rule too)
                    _rewind(data)
                    continue
                raise RegistryError(f"cannot reach the registry {self.host} ({exc.reason})") from None
            self._scheme = self._scheme or "https"
            return response

    def _refusal(self, method: str, path: str, status: int, body: bytes, answered: bool) -> str:
        detail = _error_text(body)
        if status == 401 and answered:
            return (
                f"the registry {self.host} refused the credentials ({self.credentials.source}) for "
                f"{method} {path}: {detail}"
            )
        if status == 401:
            how = (
                "set KERNELCACHE_OCI_USERNAME and KERNELCACHE_OCI_PASSWORD (or KERNELCACHE_OCI_TOKEN), "
                "or log in with `docker login` so the docker config holds them"
            )
            return f"the registry {self.host} wants credentials for {method} {path} ({detail}): {how}"
        return f"the registry {self.host} answered {status} to {method} {path}: {detail}"

    def _answer(self, challenge: str, scope: str) -> bool:
        """Whether the challenge could be answered (the header for ``scope`` is then known)."""
        kind = challenge.split(" ", 1)[0].lower()
        params = dict(_CHALLENGE.findall(challenge))
        creds = self.credentials
        if kind == "basic" and creds.basic is not None:
            self._refuse_plain_http(self.url("/"))
            self._auth[scope] = creds.basic
            return True
        if kind == "bearer" and creds.token is not None:
            self._auth[scope] = f"Bearer {creds.token}"
            return True
        if kind == "bearer" and params.get("realm"):
            self._auth[scope] = f"Bearer {self._token(params, scope, creds)}"
            return True
        return False

    def _token(self, params: dict[str, str], scope: str, creds: Credentials) -> str:
        realm = params["realm"]
        # The scope this request's operation needs (a push: pull,push), so one token serves all
        # its requests; the challenge's own only where it asks for more than that.
        scopes = [scope] + [s for s in params.get("scope", "").split(" ") if s and not _covers(scope, s)]
        wanted = {"service": params.get("service", ""), "scope": " ".join(scopes)}
        if creds.identity_token is not None or creds.basic is not None:
            self._refuse_plain_http(realm)
        if creds.identity_token is not None:
            form = {**wanted, "grant_type": "refresh_token", "refresh_token": creds.identity_token}
            request = urllib.request.Request(
                realm, data=urllib.parse.urlencode({**form, "client_id": "kernelcache"}).encode(), method="POST"
            )
        else:
            sep = "&" if "?" in realm else "?"
            query = [("service", wanted["service"]), *(("scope", s) for s in scopes)]
            request = urllib.request.Request(f"{realm}{sep}{urllib.parse.urlencode(query)}")
            if creds.basic is not None:
                request.add_unredirected_header("Authorization", creds.basic)
        try:
            with self._opener.open(request, timeout=self.timeout) as answer:
                doc = json.loads(answer.read(_MAX_SMALL_BODY))
        except urllib.error.HTTPError as exc:
            raise RegistryError(
                f"the registry {self.host}'s token service {realm} refused a token for {wanted['scope']} "
                f"({exc.code}: {_error_text(_small_body(exc))}); check the credentials ({creds.source})",
                exc.code,
            ) from None
        except (urllib.error.URLError, ValueError) as exc:
            raise RegistryError(f"no token from {realm} for the registry {self.host} ({exc})") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"the token service {realm} of {self.host} answered no token")
        return token

    def _refuse_plain_http(self, url: str) -> None:
        where = urllib.parse.urlsplit(url)
        if where.scheme != "https" and not is_loopback(where.netloc):
            raise RegistryError(f"kernelcache sends no credentials over plain http ({url}): use https")


def _covers(mine: str, asked: str) -> bool:
    """Whether the scope ``mine`` (``repository:NAME:pull,push``) grants all the scope ``asked`` does."""
    resource, _, actions = mine.rpartition(":")
    their_resource, _, their_actions = asked.rpartition(":")
    return resource == their_resource and set(their_actions.split(",")) <= set(actions.split(","))


def credentials_for(host: str) -> Credentials:
    """The credentials for the registry ``host``: the environment's, else the docker config's."""
    token = config.oci_token()
    if token:
        return Credentials(token=token, source="KERNELCACHE_OCI_TOKEN")
    user, password = config.oci_username(), config.oci_password()
    if user and password:
        return Credentials(user, password, source="KERNELCACHE_OCI_USERNAME/PASSWORD")
    return _docker_config_credentials(host)


def _docker_config_path() -> str:
    # DOCKER_CONFIG is Docker's own variable (a directory), read as Docker reads it.
    directory = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(directory, "config.json")


def _docker_config_credentials(host: str) -> Credentials:
    path = _docker_config_path()
    try:
        fd, _ = open_regular(path, follow=True)  # a FIFO there is refused, never waited on
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read(_MAX_SMALL_BODY))
    except (OSError, ValueError):
        return Credentials()
    if not isinstance(doc, dict):
        return Credentials()
    names = {host, f"https://{host}", f"http://{host}"}
    if host in _API_HOSTS:
        names |= {"https://index.docker.io/v1/", "index.docker.io", "docker.io"}
    helpers = doc.get("credHelpers") if isinstance(doc.get("credHelpers"), dict) else {}
    helper = next((helpers[n] for n in names if isinstance(helpers.get(n), str)), None) or doc.get("credsStore")
    if isinstance(helper, str) and helper:
        return _from_helper(helper, host)
    auths = doc.get("auths") if isinstance(doc.get("auths"), dict) else {}
    for key, entry in auths.items():
        if _config_host(key) in {_config_host(n) for n in names} and isinstance(entry, dict):
            return _from_auth_entry(entry, path)
    return Credentials()


def _config_host(key: str) -> str:
    """The host of a docker config ``auths`` key (``https://host/v1/`` or ``host``)."""
    return urllib.parse.urlsplit(key).netloc if "://" in key else key.split("/", 1)[0]


def _from_auth_entry(entry: dict[str, Any], path: str) -> Credentials:
    if isinstance(entry.get("identitytoken"), str) and entry["identitytoken"]:
        return Credentials(identity_token=entry["identitytoken"], source=path)
    try:
        user, _, password = base64.b64decode(str(entry.get("auth") or "")).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return Credentials()
    return Credentials(user, password, source=path) if user and password else Credentials()


def _from_helper(helper: str, host: str) -> Credentials:
    """What ``docker-credential-HELPER get`` says for ``host`` (it exits once it answered)."""
    program = f"docker-credential-{helper}"
    try:
        done = subprocess.run([program, "get"], input=host.encode(), capture_output=True, timeout=30, check=False)
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return Credentials()
    if not isinstance(answer, dict) or not answer.get("Secret"):
        return Credentials()
    if answer.get("Username") == "<token>":  # Docker's convention for an identity token
        return Credentials(identity_token=str(answer["Secret"]), source=program)
    return Credentials(str(answer.get("Username") or ""), str(answer["Secret"]), source=program)


def _not_tls(reason: object) -> bool:
    """Whether a failed https connection met a server that does not speak TLS at all."""
    return isinstance(reason, ssl.SSLError) and not isinstance(reason, ssl.SSLCertVerificationError)


def _rewind(data: Any) -> None:
    if hasattr(data, "seek"):
        data.seek(0)


def _small_body(exc: urllib.error.HTTPError) -> bytes:
    try:
        return exc.read(_MAX_SMALL_BODY)
    except OSError:
        return b""
    finally:
        exc.close()


def _error_text(body: bytes) -> str:
    """The distribution API's error (``{"errors": [{"code", "message"}]}``), else the body's start."""
    try:
        errors = json.loads(body).get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or "no detail"
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace").strip() or "no detail"
