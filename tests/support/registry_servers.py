"""Real OCI registries (Debian's docker-registry: the CNCF distribution registry) on loopback ports,
each with its own config and storage directory, started and stopped by the tests."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

REGISTRY = shutil.which("docker-registry") or shutil.which("registry")
OPENSSL = shutil.which("openssl")


def need_registry() -> None:
    if REGISTRY is None:
        pytest.skip("docker-registry is not installed (.ci/run installs Debian's docker-registry)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bcrypt_line(user: str, password: str) -> str:
    """An htpasswd line (bcrypt, the only form the registry reads); skips where crypt lacks it."""
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # Python < 3.13; glibc's libxcrypt does bcrypt
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    except (ImportError, AttributeError, OSError):
        hashed = None
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("no bcrypt here to write the registry's htpasswd file")
    return f"{user}:{hashed}\n"


def self_signed(workdir: str) -> tuple[str, str]:
    """(certificate, key) for 127.0.0.1 and localhost, made with the openssl command."""
    if OPENSSL is None:
        pytest.skip("no openssl command to make a certificate for the https registry")
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    args = [
        OPENSSL,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=127.0.0.1",
        "-addext",
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "-keyout",
        key,
        "-out",
        cert,
    ]
    subprocess.run(args, check=True, capture_output=True, timeout=60)
    return cert, key


class RegistryServer:
    """One registry on 127.0.0.1:port, storing blobs under its own directory.

    ``htpasswd``: (user, password) for basic auth; ``tls``: serve https with a self-signed
    certificate (``self.cert`` is the file a client trusts, through SSL_CERT_FILE); ``token``:
    the token scheme, with that service issuing the tokens the registry checks."""

    def __init__(
        self,
        workdir: str,
        *,
        htpasswd: tuple[str, str] | None = None,
        tls: bool = False,
        token: TokenService | None = None,
    ) -> None:
        assert REGISTRY is not None
        self.port = free_port()
        self.dir = os.path.join(workdir, f"registry-{self.port}")
        self.storage = os.path.join(self.dir, "storage")
        os.makedirs(self.storage)
        self.cert: str | None = None
        lines = [
            "version: 0.1",
            "log:",
            "  level: error",
            "  accesslog:",
            "    disabled: false",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.storage}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
            "  secret: kernelcache-tests",
        ]
        if tls:
            self.cert, key = self_signed(self.dir)
            lines += ["  tls:", f"    certificate: {self.cert}", f"    key: {key}"]
        if htpasswd is not None:
            path = os.path.join(self.dir, "htpasswd")
            with open(path, "w") as f:
                f.write(bcrypt_line(*htpasswd))
            lines += ["auth:", "  htpasswd:", "    realm: kernelcache-tests", f"    path: {path}"]
        if token is not None:
            lines += [
                "auth:",
                "  token:",
                f"    realm: {token.realm}",
                f"    service: {token.service}",
                f"    issuer: {token.issuer}",
                f"    rootcertbundle: {token.cert}",
            ]
        self.config = os.path.join(self.dir, "config.yml")
        with open(self.config, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.log = open(os.path.join(self.dir, "registry.log"), "wb")  # noqa: SIM115 - closed in stop()
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [REGISTRY, "serve", self.config], stdout=self.log, stderr=subprocess.STDOUT
        )
        self._wait_ready(tls)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ref(self, repo: str, tag: str = "v1") -> str:
        return f"oci://{self.host}/{repo}:{tag}"

    def _wait_ready(self, tls: bool, timeout: float = 20) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"docker-registry did not listen on port {self.port}")

    def requests(self, method: str, fragment: str) -> int:
        """How many requests ``METHOD ...fragment...`` the registry's access log shows so far."""
        self.log.flush()
        with open(self.log.name, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return sum(1 for line in lines if f'"{method} ' in line and fragment in line)

    def blob_file(self, digest: str) -> str:
        """Where the registry keeps the blob ``digest`` (the distribution registry's filesystem layout)."""
        hex_ = digest.split(":", 1)[1]
        return os.path.join(self.storage, "docker", "registry", "v2", "blobs", "sha256", hex_[:2], hex_, "data")

    def get(self, path: str, accept: str = "*/*") -> bytes:
        """An anonymous GET on the plain-http registry (for what a test checks beside the client)."""
        req = urllib.request.Request(f"http://{self.host}{path}", headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=20) as answer:
            return bytes(answer.read())

    def put(self, path: str, data: bytes, content_type: str) -> int:
        req = urllib.request.Request(
            f"http://{self.host}{path}", data=data, method="PUT", headers={"Content-Type": content_type}
        )
        try:
            with urllib.request.urlopen(req, timeout=20) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        self.log.close()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """A token service on loopback as the distribution spec describes one: ``GET /token?service=&scope=``
    with basic credentials answers ``{"token": JWT}``, an RS256 JWT signed (by the openssl command)
    with a key whose self-signed certificate the registry trusts (its ``x5c`` header carries it).
    Grants what is asked to ``user``/``password``; refuses anything else with 401. Counts what it issued."""

    service, issuer = "kc-test-registry", "kc-test-issuer"

    def __init__(self, workdir: str, user: str, password: str) -> None:
        self.dir = os.path.join(workdir, f"token-{os.getpid()}-{time.monotonic_ns()}")
        os.makedirs(self.dir)
        self.cert, self.key = self_signed(self.dir)
        der = subprocess.run([OPENSSL, "x509", "-in", self.cert, "-outform", "DER"], capture_output=True, check=True)
        self._x5c = base64.b64encode(der.stdout).decode()
        self._basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.issued: list[str] = []  # the scope of each token issued
        self.refused = 0
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.realm = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _jwt(self, scope: str) -> str:
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self._x5c]}
        access = []
        if scope:
            kind, name, actions = scope.split(":", 2)
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": "kc",
            "aud": self.service,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": f"{now}-{len(self.issued)}",
            "access": access,
        }
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signed = subprocess.run(
            [OPENSSL, "dgst", "-sha256", "-sign", self.key],
            input=signing.encode(),
            capture_output=True,
            check=True,
            timeout=30,
        )
        return f"{signing}.{_b64url(signed.stdout)}"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                if self.headers.get("Authorization") != service._basic:
                    service.refused += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                scope = (query.get("scope") or [""])[0]
                body = json.dumps({"token": service._jwt(scope)}).encode()
                service.issued.append(scope)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
