"""Fixtures and hooks for every test folder; helpers shared by several folders live in tests/support/."""

from __future__ import annotations

import pytest
from helpers import _gpu_available


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and driver; none found here")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _private_default_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # No test may touch the user's real cache: the default root points into tmp.
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path_factory.mktemp("default-cache")))
    monkeypatch.delenv("KERNELCACHE_DISABLE", raising=False)
    # The node's compile slots (runners/slots.py) of each test are its own: a test never waits
    # for the workers another test left (they end with their process, or idle).
    runtime = tmp_path_factory.mktemp("runtime")
    runtime.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real redis-server (tests/support/redis_servers.py) shared by the tests of one module; skips without one."""
    from redis_servers import RedisServer, need_redis

    need_redis()
    s = RedisServer(str(tmp_path_factory.mktemp("redis")))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def s3():
    """A real S3-protocol server on loopback (tests/support/object_servers.py) shared by the tests of one
    module; skips without obstore and moto."""
    from object_servers import S3Server, need_object_store

    need_object_store()
    s = S3Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """A real OCI registry (Debian's docker-registry, tests/support/registry_servers.py) on loopback, plain
    http, shared by the tests of one module; skips without one."""
    from registry_servers import RegistryServer, need_registry

    need_registry()
    r = RegistryServer(str(tmp_path_factory.mktemp("registry")))
    yield r
    r.stop()
