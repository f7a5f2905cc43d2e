"""OCI registries that want https and credentials: a real docker-registry serving TLS (a certificate
made here, trusted through SSL_CERT_FILE) with htpasswd basic auth; and a skopeo copy, another
client, moving a pushed bundle between repositories as a node agent or a mirror would.

Credentials come from the environment or from a docker config, as the README says; the CLI runs
in fresh processes.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcache.stores.bundle import format as fmt

USER, PASSWORD = "kc-user", "kc-pass-1"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory):
    """A registry on 127.0.0.1 serving https only, with basic auth (htpasswd, bcrypt)."""
    from registry_servers import RegistryServer, need_registry

    need_registry()
    server = RegistryServer(str(tmp_path_factory.mktemp("secure-registry")), htpasswd=(USER, PASSWORD), tls=True)
    yield server
    server.stop()


@pytest.fixture
def bundle_file(tmp_path: Path) -> Path:
    records = [(f"{i:064x}", os.urandom(2048), {"arch": "sm_100"}, 1.0) for i in range(3)]
    return Path(fmt.write_bundle(tmp_path / "b.kcb", records).path)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELCACHE_OCI_", "SSL_CERT", "DOCKER_CONFIG"))}
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env={**base, **env}, timeout=120
    )


def _docker_config(tmp_path: Path, host: str, user: str, password: str) -> str:
    folder = tmp_path / "docker"
    folder.mkdir()
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (folder / "config.json").write_text(json.dumps({"auths": {f"https://{host}": {"auth": auth}}}))
    return str(folder)


def test_https_with_basic_credentials_from_the_environment_or_a_docker_config(secure, bundle_file, tmp_path):
    trust = {"SSL_CERT_FILE": str(secure.cert), "DOCKER_CONFIG": str(tmp_path / "none")}
    ref = secure.ref("team/private")
    refused = _cli("bundle", "push", str(bundle_file), ref, env=trust)
    assert refused.returncode == 2 and "wants credentials" in refused.stderr
    assert "KERNELCACHE_OCI_USERNAME" in refused.stderr
    creds = {**trust, "KERNELCACHE_OCI_USERNAME": USER, "KERNELCACHE_OCI_PASSWORD": PASSWORD}
    pushed = _cli("bundle", "push", str(bundle_file), ref, "--json", env=creds)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["archs"] == ["sm_100"]
    config = {"SSL_CERT_FILE": str(secure.cert), "DOCKER_CONFIG": _docker_config(tmp_path, secure.host, USER, PASSWORD)}
    pulled = _cli("bundle", "pull", ref, str(tmp_path / "out.kcb"), env=config)
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "out.kcb").read_bytes() == bundle_file.read_bytes()


def test_wrong_credentials_and_an_untrusted_certificate_are_errors_never_a_fall_back(secure, bundle_file, tmp_path):
    ref = secure.ref("team/private2")
    wrong = {"SSL_CERT_FILE": str(secure.cert), "KERNELCACHE_OCI_USERNAME": USER, "KERNELCACHE_OCI_PASSWORD": "nope"}
    proc = _cli("bundle", "push", str(bundle_file), ref, env=wrong)
    assert proc.returncode == 2 and "refused the credentials (KERNELCACHE_OCI_USERNAME/PASSWORD)" in proc.stderr
    # The registry's certificate is not trusted: an error, not plain http (a loopback host included).
    untrusted = {"KERNELCACHE_OCI_USERNAME": USER, "KERNELCACHE_OCI_PASSWORD": PASSWORD}
    proc = _cli("bundle", "push", str(bundle_file), ref, env=untrusted)
    assert proc.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in proc.stderr


SKOPEO = shutil.which("skopeo")


@pytest.mark.skipif(SKOPEO is None, reason="skopeo is not installed (.ci/run installs Debian's skopeo)")
def test_another_client_moves_a_pushed_bundle_and_it_still_pulls_byte_identical(registry, bundle_file, tmp_path):
    from kernelcache.stores.bundle import oci

    oci.push(str(bundle_file), registry.ref("team/source"))
    src, dst = f"docker://{registry.host}/team/source:v1", f"docker://{registry.host}/mirror/kernels:v1"
    copied = subprocess.run(
        [SKOPEO, "copy", "--src-tls-verify=false", "--dest-tls-verify=false", src, dst],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert copied.returncode == 0, copied.stderr
    out = tmp_path / "mirrored.kcb"
    assert oci.pull(registry.ref("mirror/kernels"), str(out))["entries"] == 3
    assert out.read_bytes() == bundle_file.read_bytes()


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory):
    """A registry that wants bearer tokens (the scheme of Docker Hub, GHCR, ECR...), and their service."""
    from registry_servers import RegistryServer, TokenService, need_registry

    need_registry()
    work = str(tmp_path_factory.mktemp("token-registry"))
    service = TokenService(work, USER, PASSWORD)
    server = RegistryServer(work, token=service)
    yield server, service
    server.stop()
    service.stop()


def test_the_token_scheme_gets_a_token_per_scope_with_the_credentials(tokens, bundle_file, tmp_path):
    server, service = tokens
    ref = server.ref("team/tok")
    none = {"DOCKER_CONFIG": str(tmp_path / "none")}
    refused = _cli("bundle", "push", str(bundle_file), ref, env=none)
    assert refused.returncode == 2 and "refused a token" in refused.stderr and service.refused == 1
    creds = {**none, "KERNELCACHE_OCI_USERNAME": USER, "KERNELCACHE_OCI_PASSWORD": PASSWORD}
    assert _cli("bundle", "push", str(bundle_file), ref, env=creds).returncode == 0
    assert service.issued == ["repository:team/tok:pull,push"]  # one token, kept for the whole push
    config = {"DOCKER_CONFIG": _docker_config(tmp_path, server.host, USER, PASSWORD)}
    pulled = _cli("bundle", "pull", ref, str(tmp_path / "out.kcb"), env=config)
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "out.kcb").read_bytes() == bundle_file.read_bytes()
    assert service.issued[1:] == ["repository:team/tok:pull"]
    wrong = {**none, "KERNELCACHE_OCI_USERNAME": USER, "KERNELCACHE_OCI_PASSWORD": "nope"}
    proc = _cli("bundle", "pull", ref, str(tmp_path / "again.kcb"), env=wrong)
    assert proc.returncode == 2 and "refused a token" in proc.stderr and "KERNELCACHE_OCI_USERNAME" in proc.stderr
