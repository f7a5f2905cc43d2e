"""What bundle create, ls and import say and refuse: counts that agree and name what they count,
no good bundle replaced by a smaller one the source could not verify, no import into a
directory that is not a cache. Real compiles, the CLI in fresh processes, a real redis-server
and a real S3-protocol server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH

import kernelcache

SOURCES = [f'extern "C" __global__ void c{i}(float* x) {{ x[0] = {i}.5f; }}' for i in range(3)]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=full)


def _compile_into(cache: kernelcache.ProgramCacheResource) -> None:
    for src in SOURCES:
        kernelcache.compile_program(src, options=ProgramOptions(arch=ARCH), cache=cache)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    with kernelcache.FileStreamProgramCache(root) as cache:
        _compile_into(cache)  # three kernels, and a source-index record for each
    return root


def test_import_refuses_a_directory_that_is_not_a_cache_and_changes_nothing(cache_dir: Path, tmp_path: Path) -> None:
    """An import into a directory holding a user's files refuses in one line, as clear does,
    and leaves no unmarked v2/ tree behind (which clear and prune would then refuse for good)."""
    made = _cli("bundle", "create", str(tmp_path / "b.kcb"), "--cache-dir", str(cache_dir))
    assert made.returncode == 0, made.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk\n")
    proc = _cli("import", str(tmp_path / "b.kcb"), "--cache-dir", str(notes))
    clear = _cli("clear", "--yes", "--cache-dir", str(notes))
    assert proc.returncode == clear.returncode == 2, proc.stdout + proc.stderr
    assert "refusing to import into" in proc.stderr and "not a kernelcache cache root" in proc.stderr
    assert sorted(p.name for p in notes.iterdir()) == ["todo.txt"]
    # A new directory and an existing cache are imported into as before.
    fresh = tmp_path / "fresh"
    assert _cli("import", str(tmp_path / "b.kcb"), "--cache-dir", str(fresh)).returncode == 0
    assert _cli("import", str(tmp_path / "b.kcb"), "--cache-dir", str(cache_dir)).returncode == 0
    assert _cli("clear", "--yes", "--cache-dir", str(fresh)).returncode == 0


def test_create_import_and_ls_count_kernels_and_records_alike(cache_dir: Path, tmp_path: Path) -> None:
    """create, ls and import each count the kernels as ls lists them and the records apart;
    a second import of the same bundle imports nothing and says the records are there."""
    out = tmp_path / "b.kcb"
    made = _cli("bundle", "create", str(out), "--cache-dir", str(cache_dir), "--json")
    assert made.returncode == 0, made.stderr
    report = json.loads(made.stdout)
    listed = json.loads(_cli("bundle", "ls", str(out), "--json").stdout)
    ls_rows = json.loads(_cli("ls", "--json", "--cache-dir", str(cache_dir)).stdout)
    assert report["kernels"] == listed["kernels"] == len(listed["rows"]) == len(ls_rows) == 3
    assert report["records"] == listed["records"] == 6  # and three source indexes
    text = _cli("bundle", "create", str(out), "--cache-dir", str(cache_dir)).stdout
    assert "3 kernels" in text and "6 records" in text
    target = tmp_path / "target"
    first = json.loads(_cli("import", str(out), "--cache-dir", str(target), "--json").stdout)
    second_proc = _cli("import", str(out), "--cache-dir", str(target), "--json")
    second = json.loads(second_proc.stdout)
    assert (first["kernels"], first["records"], first["already_there"]) == (3, 6, 0)
    assert (second["kernels"], second["records"], second["already_there"]) == (0, 0, 6)
    assert second_proc.returncode == 0
    again = _cli("import", str(out), "--cache-dir", str(target))
    assert "imported 0 kernels (0 records) into" in again.stdout and "6 records were already there" in again.stdout


def test_create_from_redis_without_its_secret_refuses_and_keeps_the_bundle(
    cache_dir: Path, tmp_path: Path, server
) -> None:
    """Signed Redis records that this process cannot verify (no KERNELCACHE_REDIS_SECRET) are
    not "damaged": create refuses (exit 1), names the secret to set and keeps OUT as it was."""
    from kernelcache.stores.redis.store import RedisProgramCache

    with RedisProgramCache(server.url, secret="team secret") as fleet:
        _compile_into(fleet)
    out = tmp_path / "good.kcb"
    assert _cli("bundle", "create", str(out), "--cache-dir", str(cache_dir)).returncode == 0
    before = out.read_bytes()
    proc = _cli("bundle", "create", str(out), "--redis", server.url, env={"KERNELCACHE_REDIS_SECRET": ""})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "KERNELCACHE_REDIS_SECRET" in proc.stderr and "6 records" in proc.stderr
    assert out.read_bytes() == before
    ok = _cli("bundle", "create", str(out), "--redis", server.url, "--json", env={"KERNELCACHE_REDIS_SECRET": "team secret"})
    assert ok.returncode == 0 and json.loads(ok.stdout)["kernels"] == 3, ok.stderr


def test_create_from_a_signed_bucket_without_its_secret_refuses_and_keeps_the_bundle(
    cache_dir: Path, tmp_path: Path, s3
) -> None:
    """The same for an object store: KERNELCACHE_OBJECT_STORE_SECRET is named, OUT is kept."""
    from object_servers import env_for

    env = env_for(s3.endpoint)
    bucket = s3.bucket()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with kernelcache.ObjectStoreProgramCache(f"s3://{bucket}/kc", secret="team secret") as fleet:
            _compile_into(fleet)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out = tmp_path / "good.kcb"
    assert _cli("bundle", "create", str(out), "--cache-dir", str(cache_dir)).returncode == 0
    before = out.read_bytes()
    proc = _cli("bundle", "create", str(out), "--object-store", f"s3://{bucket}/kc", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "KERNELCACHE_OBJECT_STORE_SECRET" in proc.stderr
    assert out.read_bytes() == before
    signed = {**env, "KERNELCACHE_OBJECT_STORE_SECRET": "team secret"}
    ok = _cli("bundle", "create", str(out), "--object-store", f"s3://{bucket}/kc", "--json", env=signed)
    assert ok.returncode == 0 and json.loads(ok.stdout)["kernels"] == 3, ok.stderr


def test_a_missing_bundle_is_left_out_with_one_warning_and_compiles_go_on(tmp_path: Path, monkeypatch) -> None:
    """KERNELCACHE_BUNDLES naming a file that is not there (not built yet, a volume not mounted)
    is no ConfigError in every compile_program: that tier is left out with one warning."""
    import warnings

    monkeypatch.setenv("KERNELCACHE_BUNDLES", str(tmp_path / "not-built-yet.kcb"))
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "disk"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for src in SOURCES[:2]:
            kernelcache.compile_program(src, options=ProgramOptions(arch=ARCH))
    messages = [str(w.message) for w in caught if issubclass(w.category, kernelcache.KernelCacheWarning)]
    assert len(messages) == 1 and "not-built-yet.kcb" in messages[0] and "no such file" in messages[0]
    assert [type(t).__name__ for t in kernelcache.default_cache().tiers] == [
        "InMemoryProgramCache",
        "FileStreamProgramCache",
    ]
    assert _cli("config", env={"KERNELCACHE_BUNDLES": str(tmp_path / "not-built-yet.kcb")}).returncode == 0
