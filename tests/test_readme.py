"""Every Python block of the README runs as written, each in a fresh interpreter.

A block runs on CPU unless the line before its fence says otherwise:
``<!-- readme-test: gpu -->`` (needs a GPU: marked gpu, skipped here), ``<!-- readme-test: redis -->``
(its ``redis://cache-host:6379/0`` becomes a real redis-server started by the test), ``<!-- readme-test: s3 -->``
(its ``s3://team-bucket/`` becomes a bucket on moto's S3 server on loopback, started by the test).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO

ROOT = REPO
README = os.path.join(ROOT, "README.md")
_BLOCK = re.compile(r"(?:<!-- readme-test: (\w+) -->\n)?```python\n(.*?)```", re.S)


def _blocks() -> list:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    params = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        kind = m.group(1) or "cpu"
        marks = [pytest.mark.gpu] if kind == "gpu" else []
        params.append(pytest.param(kind, m.group(2), id=f"README.md:{line}-{kind}", marks=marks))
    return params


def test_the_readme_has_python_blocks() -> None:
    assert len(_blocks()) >= 5


@pytest.mark.parametrize("kind, code", _blocks())
def test_readme_block_runs_as_written(tmp_path, kind, code) -> None:
    server = None
    if "kernelcache.cupy" in code:
        pytest.importorskip("cupy")  # the CuPy block needs the `cupy` extra
    if kind == "redis":
        pytest.importorskip("redis")
        from redis_servers import RedisServer, need_redis

        need_redis()
        server = RedisServer(str(tmp_path))
        code = code.replace("redis://cache-host:6379/0", server.url)
    s3 = None
    env = {**os.environ, "KERNELCACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": os.path.join(ROOT, "src")}
    if kind == "s3":
        from object_servers import S3Server, env_for, need_object_store

        need_object_store()
        s3 = S3Server()
        code = code.replace("s3://team-bucket/", f"s3://{s3.bucket()}/")
        env.update(env_for(s3.endpoint))
    try:
        for attempt in (1, 2):  # the second run of a block is the warm one: it must work too
            proc = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
            )
            assert proc.returncode == 0, f"run {attempt}:\n{code}\n{proc.stderr}"
    finally:
        if server is not None:
            server.stop()
        if s3 is not None:
            s3.stop()
