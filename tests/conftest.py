"""Shared fixtures: real directories, real filesystems (tmpfs mounts), real processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

ARCH = "sm_90"  # compiles target this arch on CPU-only machines (NVRTC needs no GPU)


def _gpu_available() -> bool:
    try:
        from cuda.core import Device

        Device(0).set_current()
        return True
    except Exception:
        return False


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
    # Workers are this process's own unless a test asks for the node's compile server
    # (test_compile_server.py), which then runs in a directory of the test's: also where a
    # user's environment or config file turns it on.
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER", "0")


@contextlib.contextmanager
def mounted_tmpfs(size: str, *, read_only: bool = False) -> Iterator[str]:
    """A real tmpfs of ``size`` (e.g. "256k"); skips the test where mounting is not allowed."""
    point = f"/tmp/kc-mnt-{uuid.uuid4().hex[:8]}"
    os.makedirs(point)
    opts = f"size={size},mode=0700"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", point], capture_output=True)
    if proc.returncode != 0:
        os.rmdir(point)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", point], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(point)


def settle_timestamps() -> None:
    """Let files written just now get older than the filesystem's clock tick.

    compile_program does not store a compile when a header it read is stamped at or after
    the compile's start on the kernel's coarse clock (1-10 ms ticks): a test that writes a
    header and compiles at once, and expects the next call to hit, waits this long first.
    """
    time.sleep(0.012)


def in_forked_child(run):  # noqa: ANN001, ANN201 - run: a function returning JSON-able data
    """``(run()'s result, exit code)`` of a real forked child (None as the result if it failed)."""
    import json

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.write(w, json.dumps(run()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    return (json.loads(data) if data else None), os.waitstatus_to_exitcode(status)


def remount_read_only(point: str) -> None:
    subprocess.run(["mount", "-o", "remount,ro", point], check=True, capture_output=True)


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run code in a fresh interpreter (a real separate process); return its stdout."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real redis-server (tests/redis_servers.py) shared by the tests of one module; skips without one."""
    from redis_servers import RedisServer, need_redis

    need_redis()
    s = RedisServer(str(tmp_path_factory.mktemp("redis")))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def s3():
    """A real S3-protocol server on loopback (tests/object_servers.py) shared by the tests of one
    module; skips without obstore and moto."""
    from object_servers import S3Server, need_object_store

    need_object_store()
    s = S3Server()
    yield s
    s.stop()
