"""Real OCI registries (Debian's docker-registry: the CNCF distribution registry) on loopback ports,
each with its own config and storage directory, started and stopped by the tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
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
    certificate (``self.cert`` is the file a client trusts, through SSL_CERT_FILE)."""

    def __init__(self, workdir: str, *, htpasswd: tuple[str, str] | None = None, tls: bool = False) -> None:
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
