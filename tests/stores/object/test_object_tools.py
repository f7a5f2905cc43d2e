"""The remote tiers as the tools and a compile see them: ls and stats count kernels, a signed tier
lists without its secret, an http endpoint and a missing bucket are explained with their cause,
and a slow store costs a miss a bounded number of requests. A real S3-protocol server (moto) on
loopback, a real slowing proxy in front of it, a real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH
from object_servers import FaultProxy, S3Server, env_for, need_object_store, set_env

import kernelcache
from kernelcache import FileStreamProgramCache, InMemoryProgramCache, KernelCacheWarning, TieredProgramCache

need_object_store()

from kernelcache import ObjectStoreProgramCache  # noqa: E402

SOURCE = 'extern "C" __global__ void listed(float* x) { x[0] = 3.0f; }'


def _kc(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], env={**os.environ, **env}, capture_output=True, text=True
    )


def _warned(fn) -> list[str]:  # noqa: ANN001 - any callable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, KernelCacheWarning)]


def _one_compile(store: kernelcache.ProgramCacheResource) -> None:
    with FileStreamProgramCache(tempfile.mkdtemp()) as disk:
        cache = TieredProgramCache([InMemoryProgramCache(), disk, store])
        kernelcache.compile_program(SOURCE, options=ProgramOptions(arch=ARCH), cache=cache)


def test_ls_and_stats_of_a_signed_bucket_count_and_name_its_kernels(s3: S3Server, monkeypatch) -> None:
    """One compile stores a kernel and its source index: ls lists the kernel by name and arch
    (no secret needed to list), stats counts one kernel and two records, in text and JSON."""
    set_env(monkeypatch, s3.endpoint)
    url = f"s3://{s3.bucket()}/team"
    _one_compile(ObjectStoreProgramCache(url, secret="team secret"))
    env = {**env_for(s3.endpoint), "KERNELCACHE_DIR": "/nonexistent/kc"}
    ls = _kc("ls", "--object-store", url, "--json", env=env)
    assert ls.returncode == 0, ls.stderr
    (row,) = json.loads(ls.stdout)
    assert (row["kernels"], row["arch"], row["code_type"]) == (["listed"], ARCH, "c++")
    stats = _kc("stats", "--object-store", url, "--json", env=env)
    assert stats.returncode == 0, stats.stderr
    held = json.loads(stats.stdout)["object"]
    assert (held["entries"], held["records"]) == (1, 2) and held["size_bytes"] > 0
    text = _kc("stats", "--object-store", url, env=env)
    assert text.returncode == 0 and "entries" in text.stdout, text.stderr


def test_ls_and_stats_of_a_redis_namespace_count_its_kernels(server) -> None:
    """ls --redis lists the kernels of a namespace; stats --redis counts kernels, not Redis keys."""
    from kernelcache.stores.redis.store import RedisProgramCache

    ns = "tools-" + os.urandom(4).hex()
    with RedisProgramCache(server.url, namespace=ns, secret="s") as fleet:
        _one_compile(fleet)
    env = {"KERNELCACHE_DIR": "/nonexistent/kc"}
    ls = _kc("ls", "--redis", server.url, "--redis-namespace", ns, "--json", env=env)
    assert ls.returncode == 0, ls.stderr
    (row,) = json.loads(ls.stdout)  # the kernel; its source index is no row
    assert (row["kernels"], row["arch"]) == (["listed"], ARCH)
    assert json.loads(_kc("ls", "--redis", server.url, "--json", env=env).stdout) == []  # another namespace
    stats = _kc(
        "stats", "--redis", server.url, "--redis-namespace", ns, "--json", env={"KERNELCACHE_DIR": "/nonexistent/kc"}
    )
    assert stats.returncode == 0, stats.stderr
    fleet_view = json.loads(stats.stdout)["fleet"]
    assert (fleet_view["entries"], fleet_view["records"]) == (1, 2)


def test_plain_http_without_allow_http_is_explained_with_its_cause(s3: S3Server, monkeypatch) -> None:
    """obstore refuses an http endpoint unless AWS_ALLOW_HTTP is set; the one warning says so."""
    set_env(monkeypatch, s3.endpoint)
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    store = ObjectStoreProgramCache(f"s3://{s3.bucket()}/x")
    messages = _warned(lambda: _one_compile(store))
    assert len(messages) == 1, messages
    assert "plain http" in messages[0] and "AWS_ALLOW_HTTP=true" in messages[0]


def test_a_missing_bucket_is_explained_once_whatever_call_meets_it(s3: S3Server, monkeypatch) -> None:
    """Look-up, lock and store of a compile into a bucket that does not exist: one warning, that
    the bucket does not exist (not "failed to lock (FileNotFoundError ...)"), and no back-off."""
    set_env(monkeypatch, s3.endpoint)
    store = ObjectStoreProgramCache(f"s3://{s3.bucket()}-missing/x")
    messages = _warned(lambda: _one_compile(store))
    assert len(messages) == 1 and "does not exist" in messages[0], messages
    assert "FileNotFoundError" not in messages[0]
    assert store.stats()["backing_off"] == 0 and set(store.stats()["errors_by_cause"]) == {"refused"}


def test_a_slow_store_costs_a_miss_at_most_three_requests(s3: S3Server, monkeypatch) -> None:
    """Every request answered, each after 2.2 s (more than the 2 s a request may take): a
    compile's miss pays the first slow answer, then the store is skipped like one that failed,
    with one warning. Before, nothing failed, so nothing backed off: 13 requests in a row."""
    proxy = FaultProxy(s3.endpoint, stall_s=2.2)
    bucket = s3.bucket()
    set_env(monkeypatch, proxy.endpoint)
    try:
        store = ObjectStoreProgramCache(f"s3://{bucket}/slow")
        proxy.mode = "slow"
        messages = _warned(lambda: _one_compile(store))
        assert proxy.count() <= 3, proxy.requests
        assert len(messages) == 1 and "took" in messages[0] and "skipped" in messages[0], messages
        assert store.stats()["backing_off"] == 1
    finally:
        proxy.stop()


@pytest.fixture(autouse=True)
def _quiet_moto() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
