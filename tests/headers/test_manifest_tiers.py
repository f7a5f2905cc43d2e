"""Header manifests through a tiered store: every host's variants survive in the shared tier.

Each "host" is a real process with its own disk directory and memory tier (the default
cache: memory -> disk -> Redis), all sharing one real redis-server. A host whose memory
holds an old copy of a manifest must neither miss a variant another host added to the
shared tier nor drop it when it adds its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from helpers import ARCH, settle_timestamps, support_script

pytest.importorskip("redis")

HOST = support_script("_manifest_host.py")


class Host:
    """A long-lived process compiling the test's source with the default cache."""

    def __init__(self, tmp_path, name: str, redis_url: str, source: str, include_dir: str) -> None:
        env = {
            **os.environ,
            "KERNELCACHE_DIR": str(tmp_path / f"disk-{name}"),
            "KERNELCACHE_REDIS_URL": redis_url,
        }
        self.proc = subprocess.Popen(
            [sys.executable, HOST, source, include_dir, ARCH],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def compile(self) -> bool:
        """Compile once; whether it was a hit."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the host process died"
        return json.loads(line)["hit"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def _setup(tmp_path) -> tuple[str, str]:
    include = tmp_path / "inc"
    include.mkdir()
    # A source of this test alone (the redis-server is the module's).
    source = f'// {uuid.uuid4().hex}\n#include "h.h"\nextern "C" __global__ void k(float* x) {{ x[0] = VALUE; }}\n'
    return source, str(include)


def _header(include: str, value: str) -> None:
    with open(os.path.join(include, "h.h"), "w") as f:
        f.write(f"#define VALUE {value}\n")
    settle_timestamps()


@contextlib.contextmanager
def _a_then_b(tmp_path, server) -> Iterator[tuple[Host, str, str]]:
    """Host A compiles with h.h = X (its memory and disk now hold the manifest [X]), then
    host B with h.h = Y (the shared manifest is [Y, X]; Y's artifact is in Redis)."""
    source, include = _setup(tmp_path)
    a = Host(tmp_path, "a", server.url, source, include)
    b = Host(tmp_path, "b", server.url, source, include)
    try:
        _header(include, "1.0f")
        assert a.compile() is False
        _header(include, "2.0f")
        assert b.compile() is False
        yield a, source, include
    finally:
        a.close()
        b.close()


def test_a_host_finds_a_variant_another_host_added(tmp_path, server) -> None:
    with _a_then_b(tmp_path, server) as (a, _, _):
        # A's nearest manifest ([X], in its memory) has no variant for Y: the shared one has.
        assert a.compile() is True


def test_adding_a_variant_keeps_the_variants_other_hosts_added(tmp_path, server) -> None:
    with _a_then_b(tmp_path, server) as (a, source, include):
        _header(include, "3.0f")
        assert a.compile() is False  # a new header version: A adds Z to the manifest
    # A new host sees every variant any host added: Y is still a hit, fleet-wide.
    c = Host(tmp_path, "c", server.url, source, include)
    try:
        _header(include, "2.0f")
        assert c.compile() is True
        _header(include, "1.0f")
        assert c.compile() is True
    finally:
        c.close()
