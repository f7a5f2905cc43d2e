"""Configuration without code: environment variables, through the real entry points.

Every case runs in a fresh interpreter (or the `kernelcache` command) with the variables set,
as a user would: `default_cache()` and `compile_program()` with no cache argument.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from helpers import ARCH, REPO

KERNEL = 'extern "C" __global__ void k%d(float* a) { a[threadIdx.x] = %d.0f; }\n'

COMPILE = f"""
import json, sys
from cuda.core import ProgramOptions
import kernelcache
from kernelcache import CompileInfo, compile_program
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
hits = []
for i in range(n):
    info = CompileInfo()
    compile_program({KERNEL!r} % (i, i), options=ProgramOptions(arch={ARCH!r}), info=info)
    hits.append(info.hit)
c = kernelcache.default_cache()
print(json.dumps({{"type": type(c).__name__, "hits": hits,
                  "max": getattr(c, "max_size_bytes", "n/a"),
                  "tiers": [type(t).__name__ for t in getattr(c, "tiers", [])]}}))
"""


def py(code: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )


def kc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def ok(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- KERNELCACHE_MAX_SIZE ------------------------------------------------------------------


def test_default_cache_has_a_finite_cap_of_10gb(tmp_path) -> None:
    got = ok(py(COMPILE, env={"KERNELCACHE_DIR": str(tmp_path)}))
    assert got["type"] == "FileStreamProgramCache" and got["max"] == 10 * 10**9


def test_max_size_env_caps_and_evicts(tmp_path) -> None:
    env = {"KERNELCACHE_DIR": str(tmp_path), "KERNELCACHE_MAX_SIZE": "12KB"}
    got = ok(py(COMPILE, "6", env=env))
    assert got["max"] == 12_000
    stats = json.loads(kc("stats", "--json", "--cache-dir", str(tmp_path), env=env).stdout)["disk"]
    assert stats["evictions"] >= 1 and stats["size_bytes"] <= 12_000
    assert stats["max_size_bytes"] == 12_000
    assert "12.0 kB" in kc("stats", "--cache-dir", str(tmp_path), env=env).stdout


@pytest.mark.parametrize("value", ["none", "unlimited", "0"])
def test_no_cap_is_shown_as_such(tmp_path, value) -> None:
    env = {"KERNELCACHE_DIR": str(tmp_path), "KERNELCACHE_MAX_SIZE": value}
    assert ok(py(COMPILE, env=env))["max"] is None
    text = kc("stats", "--cache-dir", str(tmp_path), env=env).stdout
    assert "no cap" in text
    data = json.loads(kc("stats", "--json", "--cache-dir", str(tmp_path), env=env).stdout)["disk"]
    assert data["max_size_bytes"] is None


def test_cli_shows_the_default_cap(tmp_path) -> None:
    text = kc("stats", "--cache-dir", str(tmp_path)).stdout
    assert "10.0 GB" in text and "max_size_bytes" not in text.replace("max size", "")


# -- bad values: one clear error naming the variable ------------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("KERNELCACHE_MAX_SIZE", "lots"),
        ("KERNELCACHE_MAX_SIZE", "1" + "0" * 400 + "TB"),
        ("KERNELCACHE_DISABLE", "garbage"),
        ("KERNELCACHE_REDIS_READ_ONLY", "maybe"),
        ("KERNELCACHE_ALLOW_SHARED", "sure"),
        ("KERNELCACHE_REDIS_URL", "http://127.0.0.1:1/0"),
        # Values the first check let through, then failed (or were ignored) further down:
        ("KERNELCACHE_MAX_SIZE", "0GB"),
        ("KERNELCACHE_MAX_SIZE", "0.5B"),
        ("KERNELCACHE_REDIS_URL", "redis://127.0.0.1:port/0"),
        ("KERNELCACHE_REDIS_URL", "redis://127.0.0.1:99999/0"),
        ("KERNELCACHE_REDIS_URL", "redis://127.0.0.1:6379/cache"),
        ("KERNELCACHE_REDIS_URL", "redis+cluster://127.0.0.1:7000/1"),
        ("KERNELCACHE_REDIS_URL", "redis://127.0.0.1:6379/0?decode_responses=yes"),
        ("KERNELCACHE_WAIT_TIMEOUT", "soon"),
        ("KERNELCACHE_WAIT_TIMEOUT", "1e10"),  # accepted, then OverflowError in every compile
    ],
)
def test_bad_value_is_named_in_one_clear_error(tmp_path, name, value) -> None:
    env = {"KERNELCACHE_DIR": str(tmp_path / "c"), name: value}
    proc = py(COMPILE, env=env)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kernelcache.config.ConfigError") and name in last and repr(value)[:40] in last
    line = one_line(kc("demo", "--json", env=env))
    assert name in line
    assert not os.path.exists(tmp_path / "c")  # nothing created before the error


def test_kernelcache_dir_pointing_at_a_file(tmp_path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    env = {"KERNELCACHE_DIR": str(afile)}
    proc = py(COMPILE, env=env)  # raises in compile_program: a bad value is not degraded to a warning
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kernelcache.config.ConfigError: KERNELCACHE_DIR=") and "not a directory" in last
    assert "kernelcache/compile/flow.py" in proc.stderr  # raised by the compile itself, not by default_cache() after it
    line = one_line(kc("stats", env=env))
    assert "KERNELCACHE_DIR" in line and "not a directory" in line
    line = one_line(kc("stats", "--cache-dir", str(afile)))
    assert "not a directory" in line.lower() or "is a file" in line


def test_disable_accepts_the_usual_false_values(tmp_path) -> None:
    for value in ("0", "false", "no", "off", ""):
        got = ok(py(COMPILE, env={"KERNELCACHE_DIR": str(tmp_path / value), "KERNELCACHE_DISABLE": value}))
        assert got["hits"] == [False]
    assert os.path.isdir(tmp_path / "0")


# -- KERNELCACHE_REDIS_URL: the default cache becomes memory -> disk -> Redis -------------------


@pytest.fixture
def redis_url(tmp_path):
    pytest.importorskip("redis")
    from redis_servers import RedisServer, need_redis

    need_redis()
    server = RedisServer(str(tmp_path))
    yield server.url
    server.stop()


def test_redis_url_makes_the_default_cache_tiered(tmp_path, redis_url) -> None:
    host_a = {"KERNELCACHE_DIR": str(tmp_path / "a"), "KERNELCACHE_REDIS_URL": redis_url}
    first = ok(py(COMPILE, env=host_a))
    assert first["type"] == "TieredProgramCache" and first["hits"] == [False]
    assert first["tiers"] == ["InMemoryProgramCache", "FileStreamProgramCache", "RedisProgramCache"]
    # another "host": empty local directory, same Redis: a hit with no compile
    host_b = {"KERNELCACHE_DIR": str(tmp_path / "b"), "KERNELCACHE_REDIS_URL": redis_url}
    assert ok(py(COMPILE, env=host_b))["hits"] == [True]
    # the CLI's --redis defaults to the same variable
    data = json.loads(kc("stats", "--json", "--cache-dir", str(tmp_path / "b"), env=host_b).stdout)
    assert data["fleet"]["entries"] >= 1 and data["fleet"]["url"] == redis_url


def test_redis_secret_and_read_only(tmp_path, redis_url) -> None:
    from kernelcache import RedisProgramCache

    signed = {"KERNELCACHE_DIR": str(tmp_path / "a"), "KERNELCACHE_REDIS_URL": redis_url}
    signed["KERNELCACHE_REDIS_SECRET"] = "team secret"
    assert ok(py(COMPILE, env=signed))["hits"] == [False]
    # a reader with another secret does not trust the entry: a miss, compiled locally
    other = {**signed, "KERNELCACHE_DIR": str(tmp_path / "b"), "KERNELCACHE_REDIS_SECRET": "not it"}
    other["KERNELCACHE_REDIS_READ_ONLY"] = "1"
    assert ok(py(COMPILE, env=other))["hits"] == [False]
    # the right secret: a hit
    same = {**signed, "KERNELCACHE_DIR": str(tmp_path / "c")}
    assert ok(py(COMPILE, env=same))["hits"] == [True]
    # read-only wrote nothing: Redis holds the one entry (plus nothing from the "other" process)
    with RedisProgramCache(redis_url) as rc:
        before = len(rc)
    ro = {**same, "KERNELCACHE_DIR": str(tmp_path / "d"), "KERNELCACHE_REDIS_READ_ONLY": "true"}
    assert ok(py(COMPILE, "3", env=ro))["hits"] == [True, False, False]
    with RedisProgramCache(redis_url) as rc:
        assert len(rc) == before


# A host whose disk cache directory cannot be used still shares through Redis: the default
# cache skips only the broken tier (memory -> Redis), with one warning naming the directory.
SHARE = f"""
import json, warnings
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, KernelCacheWarning, compile_program
from kernelcache.stores.default import default_cache_or_none
hits = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        info = CompileInfo()
        compile_program({KERNEL % (7, 7)!r}, options=ProgramOptions(arch={ARCH!r}), info=info)
        hits.append(info.hit)
c = default_cache_or_none()  # the store compile_program used (None: it compiled uncached)
print(json.dumps({{"hits": hits, "compiles": c.stats()["compiles"] if c is not None else None,
                  "tiers": [type(t).__name__ for t in getattr(c, "tiers", [])],
                  "warnings": [str(w.message) for w in caught if w.category is KernelCacheWarning]}}))
"""


def _unusable_dir(kind: str, tmp_path, stack) -> str:
    if kind == "other-user":  # a directory that another real user (nobody) owns: refused
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        return str(theirs)
    from helpers import mounted_tmpfs, remount_read_only

    point = stack.enter_context(mounted_tmpfs("1m"))  # a real read-only mount: nothing can be created
    remount_read_only(point)
    return os.path.join(point, "kernelcache")


@pytest.mark.parametrize("kind", ["other-user", "read-only-mount"])
def test_unusable_disk_dir_still_shares_through_redis(tmp_path, redis_url, kind) -> None:
    import contextlib

    writer = {"KERNELCACHE_DIR": str(tmp_path / "a"), "KERNELCACHE_REDIS_URL": redis_url}
    first = ok(py(SHARE, env=writer))
    assert first["hits"] == [False, True] and first["compiles"] == 1 and first["warnings"] == []
    with contextlib.ExitStack() as stack:
        broken = _unusable_dir(kind, tmp_path, stack)
        reader = {"KERNELCACHE_DIR": broken, "KERNELCACHE_REDIS_URL": redis_url}
        got = ok(py(SHARE, env=reader))
        assert got["hits"] == [True, True] and got["compiles"] == 0, got
        assert got["tiers"] == ["InMemoryProgramCache", "RedisProgramCache"]
        assert len(got["warnings"]) == 1 and broken in got["warnings"][0] and "Redis" in got["warnings"][0]
        # a bad value is still an error, not a degraded store
        proc = py(SHARE, env={**reader, "KERNELCACHE_REDIS_READ_ONLY": "maybe"})
        assert proc.returncode != 0 and "ConfigError: KERNELCACHE_REDIS_READ_ONLY" in proc.stderr
        # without Redis the same directory still compiles uncached, with one warning
        alone = ok(py(SHARE, env={"KERNELCACHE_DIR": broken}))
        assert alone["hits"] == [False, False] and alone["tiers"] == []
        assert len(alone["warnings"]) == 1 and "uncached" in alone["warnings"][0]


# -- KERNELCACHE_ALLOW_SHARED and --allow-shared -----------------------------------------------


def test_allow_shared_env_and_flag(tmp_path) -> None:
    shared = tmp_path / "team"
    shared.mkdir()
    os.chmod(shared, 0o2770)
    assert stat.S_IMODE(os.stat(shared).st_mode) & stat.S_IWGRP
    refused = py(COMPILE, env={"KERNELCACHE_DIR": str(shared)})
    assert refused.returncode != 0 and "allow_shared" in refused.stderr
    assert ok(py(COMPILE, env={"KERNELCACHE_DIR": str(shared), "KERNELCACHE_ALLOW_SHARED": "1"}))["hits"] == [False]
    assert "KERNELCACHE_ALLOW_SHARED" in one_line(kc("stats", "--cache-dir", str(shared)))
    for command in (["stats"], ["ls"], ["verify"], ["prune", "--older-than", "30d"], ["clear", "--yes"]):
        proc = kc(*command, "--cache-dir", str(shared), "--allow-shared")
        assert proc.returncode == 0, (command, proc.stderr)
        proc = kc(*command, "--cache-dir", str(shared), env={"KERNELCACHE_ALLOW_SHARED": "1"})
        assert proc.returncode == 0, (command, proc.stderr)


def test_kernelcache_dir_with_a_tilde_is_under_home(tmp_path) -> None:
    # Set where no shell expands it (a systemd unit, a Dockerfile ENV, a .env file):
    # "~/kc" must be the home's kc, not a directory named "~" in whatever the cwd is.
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    import kernelcache

    src = os.path.dirname(os.path.dirname(kernelcache.__file__))  # the code under test, whatever the cwd
    env = {**os.environ, "KERNELCACHE_DIR": "~/kc", "HOME": str(home), "PYTHONPATH": src}
    code = "import kernelcache; print(kernelcache.default_cache().path)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120)
    assert out.stdout.strip() == str(home / "kc"), out.stderr
    assert os.listdir(cwd) == []
    stats = subprocess.run(
        [sys.executable, "-m", "kernelcache", "stats"], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )
    assert stats.returncode == 0 and str(home / "kc") in stats.stdout, stats.stderr
    assert os.listdir(cwd) == []


@pytest.mark.parametrize("value", [1e10, float("nan"), -1, float("-inf"), "600"])
def test_wait_timeout_argument_no_lock_can_take_raises_at_once(tmp_path, value) -> None:
    # 1e10 s went through to the lock wait: OverflowError out of every compile.
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_program

    with pytest.raises(ValueError, match="wait_timeout"):
        compile_program(
            KERNEL % (0, 0), options=ProgramOptions(arch=ARCH), cache=FileStreamProgramCache(tmp_path), wait_timeout=value
        )


def test_warm_fills_the_redis_of_kernelcache_redis_url(tmp_path, redis_url) -> None:
    manifest = os.path.join(REPO, "examples", "warm.toml")
    env = {"KERNELCACHE_REDIS_URL": redis_url, "KERNELCACHE_REDIS_SECRET": "s"}
    first = json.loads(kc("warm", manifest, "--json", "--cache-dir", str(tmp_path / "a"), env=env).stdout)
    assert len(first) == 4 and not any(r["hit"] for r in first)
    # another host, empty directory: every kernel comes from Redis, none is compiled
    again = json.loads(kc("warm", manifest, "--json", "--cache-dir", str(tmp_path / "b"), env=env).stdout)
    assert all(r["hit"] for r in again)
    # --redis names it without the variable
    other = json.loads(
        kc("warm", manifest, "--json", "--redis", redis_url, "--cache-dir", str(tmp_path / "c"),
           env={"KERNELCACHE_REDIS_SECRET": "s"}).stdout
    )
    assert all(r["hit"] for r in other)


def test_the_default_config_and_cache_dirs_are_platformdirs_own(monkeypatch, tmp_path) -> None:
    """Found without importing platformdirs where it can be, and always where platformdirs says."""
    import platformdirs

    from kernelcache import config
    from kernelcache.config import file as configfile

    monkeypatch.delenv("KERNELCACHE_DIR", raising=False)
    for env in (
        {"HOME": str(tmp_path)},
        {"HOME": str(tmp_path) + "/"},
        {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "x"), "XDG_CACHE_HOME": str(tmp_path / "y")},
        {"HOME": str(tmp_path), "XDG_CACHE_HOME": "relative"},
        {"HOME": "relative-home"},
    ):
        for name in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        theirs = os.path.join(platformdirs.user_config_dir("kernelcache", appauthor=False), "config.toml")
        assert configfile.default_path() == theirs
        assert config.cache_dir() == platformdirs.user_cache_dir("kernelcache", appauthor=False)
