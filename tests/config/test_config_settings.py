"""Settings you can see and set once: ``kernelcache config`` and where each value came from, the
cap kept in a cache directory, the config file, unknown variables, ``kernelcache init --team``."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ARCH
from uids import User, unique

from kernelcache import FileStreamProgramCache


def _kc(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=env)


def _py(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("KERNELCACHE_")}
    out["KERNELCACHE_DIR"] = str(tmp_path / "cache")
    out["KERNELCACHE_CONFIG"] = str(tmp_path / "config.toml")
    (tmp_path / "config.toml").write_text("")
    return out


def _sources(env: dict[str, str], *args: str) -> dict[str, tuple[str, str]]:
    proc = _kc("config", *args, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    return {row["variable"]: (row["value"], row["source"]) for row in json.loads(proc.stdout)}


def test_config_shows_each_value_and_where_it_came_from(env, tmp_path) -> None:
    (tmp_path / "config.toml").write_text(
        'wait-timeout = 30\nredis_url = "redis://file-host:6379/0"\nallow_shared = true\n'
    )
    env = {**env, "KERNELCACHE_REDIS_URL": "redis://env-host:6379/0", "KERNELCACHE_REDIS_SECRET": "s3cret"}
    rows = _sources(env)
    in_file = f"config file {tmp_path / 'config.toml'}"
    assert rows["KERNELCACHE_WAIT_TIMEOUT"] == ("30", in_file)
    assert rows["KERNELCACHE_ALLOW_SHARED"] == ("1", in_file)
    assert rows["KERNELCACHE_REDIS_URL"] == ("redis://env-host:6379/0", "environment")  # the environment wins
    assert rows["KERNELCACHE_REDIS_SECRET"] == ("(set)", "environment")  # never printed
    assert rows["KERNELCACHE_DIR"] == (env["KERNELCACHE_DIR"], "environment")
    assert rows["KERNELCACHE_MAX_SIZE"] == ("10.0 GB", "default")
    for name in ("KERNELCACHE_DISABLE", "KERNELCACHE_RECORD", "KERNELCACHE_REQUIRE_HIT", "KERNELCACHE_BASE_DIR"):
        assert rows[name][1] == "default"
    assert "KERNELCACHE_BUNDLES" in rows and "KERNELCACHE_OBJECT_STORE_URL" in rows


def test_the_config_file_sets_what_the_environment_does_not(env, tmp_path) -> None:
    (tmp_path / "config.toml").write_text('KERNELCACHE_MAX_SIZE = "5GB"\nwait_timeout = 7\n')
    code = "from kernelcache import config; print(config.max_size_bytes(), config.wait_timeout_s())"
    assert _py(code, env).stdout.split() == ["5000000000", "7.0"]
    assert _py(code, {**env, "KERNELCACHE_MAX_SIZE": "1GB"}).stdout.split() == ["1000000000", "7.0"]
    (tmp_path / "config.toml").write_text("max_size = [1, 2]\n")
    proc = _py("from kernelcache import config; config.check()", env)
    assert "max_size = [1, 2] is not a string" in proc.stderr
    (tmp_path / "config.toml").write_text("max_size = \n")
    proc = _kc("stats", env=env)
    assert proc.returncode == 2 and "config file" in proc.stderr and "cannot be used" in proc.stderr
    proc = _kc("stats", env={**env, "KERNELCACHE_CONFIG": str(tmp_path / "nope.toml")})
    assert proc.returncode == 2 and "KERNELCACHE_CONFIG" in proc.stderr and "no such file" in proc.stderr


def test_an_unknown_variable_is_one_warning_naming_the_closest(env, tmp_path) -> None:
    code = """
        import warnings
        from kernelcache import config
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config.check(); config.check()
        print(len(caught)); print(caught[0].message)
    """
    out = _py(code, {**env, "KERNELCACHE_MAXSIZE": "1GB"}).stdout.splitlines()
    assert out[0] == "1" and "KERNELCACHE_MAXSIZE" in out[1] and "did you mean KERNELCACHE_MAX_SIZE?" in out[1]
    (tmp_path / "config.toml").write_text('redis_ulr = "redis://x:1/0"\n')
    out = _py(code, env).stdout.splitlines()
    assert out[0] == "1" and "KERNELCACHE_REDIS_ULR" in out[1] and "did you mean KERNELCACHE_REDIS_URL?" in out[1]


_COMPILE = """
    import sys
    from cuda.core import ProgramOptions
    from kernelcache import compile_program, default_cache
    for i in range(4):
        compile_program('__global__ void k%d(float* x) { x[0] = %d; }' % (i, i), options=ProgramOptions(arch=sys.argv[1]))
    print(default_cache().max_size_bytes)
"""


def _compile(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_COMPILE), ARCH], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_cap_set_in_the_cache_directory_is_used_by_a_process_that_sets_none(env, tmp_path) -> None:
    root = env["KERNELCACHE_DIR"]
    assert _compile(env) == str(10 * 10**9)  # the default, and four entries
    pair = max(os.path.getsize(p) + os.path.getsize(p + ".meta") for p in _cubins(root))
    one_entry = pair * 3 // 2  # room for one entry, not two
    shutil.rmtree(root)
    FileStreamProgramCache(root)  # an empty cache
    proc = _kc("config", "--cache-dir", root, "set", "max-size", f"{one_entry}B", env=env)
    assert proc.returncode == 0, proc.stderr
    assert _compile(env) == str(one_entry)  # in force, with no variable set
    assert len(_cubins(root)) == 1  # and enforced: evicted down to one kernel
    assert FileStreamProgramCache(root).max_size_bytes == one_entry
    assert FileStreamProgramCache(root, 10**9).max_size_bytes == 10**9
    assert _compile({**env, "KERNELCACHE_MAX_SIZE": "3GB"}) == "3000000000"  # the variable wins
    rows = _sources(env, "--cache-dir", root)
    assert rows["KERNELCACHE_MAX_SIZE"][1] == f"the cache directory ({root}/config.toml)"
    stats = json.loads(_kc("stats", "--json", env=env).stdout)["disk"]
    assert stats["max_size_bytes"] == one_entry and stats["max_size_source"].startswith("the cache directory")
    proc = _kc("config", "--cache-dir", root, "set", "max-size", "lots", env=env)
    assert proc.returncode == 2 and "bad size 'lots'" in proc.stderr


def _cubins(root: str) -> list[str]:
    """The entries holding a kernel (not the small source-index records beside them)."""
    return [p for p in _files(root) if not p.endswith(".meta") and Path(p).read_bytes()[:4] == b"\x7fELF"]


def _files(root: str) -> list[str]:
    entries = os.path.join(root, "v2", "entries")
    return [os.path.join(d, f) for d, _, fs in os.walk(entries) for f in fs]


# -- kernelcache init --team --------------------------------------------------------------------

_TEAM, _A, _B = unique("kcfleet_team"), unique("kcfleet_a"), unique("kcfleet_b")
_OTHER = unique("kcfleet_other")
_as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create real second users",
)


@pytest.fixture
def team_users():
    def run(*argv: str, check: bool = True) -> None:
        subprocess.run(argv, check=check, capture_output=True)

    for name in (_A, _B):
        run("userdel", name, check=False)
    for group in (_TEAM, _OTHER):
        run("groupdel", group, check=False)
    run("groupadd", _TEAM)
    run("groupadd", _OTHER)
    for name in (_A, _B):
        run("useradd", "-M", "-N", "-g", _TEAM, "-s", "/usr/sbin/nologin", name)
    try:
        yield run
    finally:
        for name in (_A, _B):
            run("userdel", name, check=False)
        for group in (_TEAM, _OTHER):
            run("groupdel", group, check=False)


def _member(name: str):  # noqa: ANN202 - test_stores_uids.User
    pw = pwd.getpwnam(name)
    return User(name, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(name, pw.pw_gid)))


def _put(root: str, key: bytes) -> None:
    with FileStreamProgramCache(root, allow_shared=True) as cache:
        cache[key] = b"cubin of " + key


def _get(root: str, key: bytes) -> bytes | None:
    with FileStreamProgramCache(root, allow_shared=True) as cache:
        return cache.get(key)


def _team_base(tmp_path) -> str:
    base = f"/tmp/kcfleet-{os.getpid()}-{tmp_path.name}"
    os.makedirs(base, exist_ok=True)
    os.chmod(base, 0o1777)
    return base


@_as_root
@pytest.mark.parametrize("made_by", ["init --team", "the first writer"])
def test_a_member_who_leaves_the_group_does_not_lock_the_others_out(team_users, tmp_path, made_by) -> None:
    base = _team_base(tmp_path)
    root = os.path.join(base, "team")
    try:
        if made_by == "init --team":
            proc = _kc("init", "--team", _TEAM, root, env=dict(os.environ))
            assert proc.returncode == 0, proc.stderr
            st = os.stat(root)
            assert (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)) == (0, _gid(_TEAM), "0o2770")
            assert os.path.isfile(os.path.join(root, "CACHEDIR.TAG"))
        from uids import as_user

        a, b = _member(_A), _member(_B)
        as_user(a, _put, root, b"from-a", umask=0o002)
        team_users("usermod", "-g", _OTHER, _A)  # A leaves the team
        if made_by == "init --team":
            assert as_user(b, _get, root, b"from-a") == b"cubin of from-a"  # A's entry, read by B
            as_user(b, _put, root, b"from-b", umask=0o002)  # and B still writes
            assert as_user(b, _get, root, b"from-b") == b"cubin of from-b"
        else:
            with pytest.raises(PermissionError, match="not a member of the cache's group"):
                as_user(b, _get, root, b"from-a")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _gid(group: str) -> int:
    import grp

    return grp.getgrnam(group).gr_gid


def test_init_refuses_an_unknown_group_and_a_foreign_directory(tmp_path) -> None:
    env = dict(os.environ)
    proc = _kc("init", "--team", "no-such-group-kc", str(tmp_path / "t"), env=env)
    assert proc.returncode == 2 and "no group named" in proc.stderr
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    import grp

    group = grp.getgrgid(os.getgid()).gr_name
    proc = _kc("init", "--team", group, str(tmp_path / "busy"), env=env)
    assert proc.returncode == 2 and "not empty" in proc.stderr
    assert os.listdir(tmp_path / "busy") == ["notes.txt"]



def test_recache_and_disable_from_the_config_file_reach_compile_program(env, tmp_path) -> None:
    """compile_program asks DISABLE, RECORD and RECACHE only when one of them is set: a value only
    the config file sets counts as set. A fresh process per setting, on one stored kernel: recache
    compiles it again, disable compiles without the cache, record appends the request, none: a hit."""
    code = f"""
        import json
        from cuda.core import ProgramOptions
        from kernelcache import CompileInfo, compile_program
        info = CompileInfo()
        src = 'extern "C" __global__ void k(float* a) {{ a[threadIdx.x] = 5.0f; }}'
        compile_program(src, options=ProgramOptions(arch={ARCH!r}), info=info)
        print(json.dumps([info.hit, info.cached]))
        """
    config_file, lock = tmp_path / "config.toml", tmp_path / "kernels.lock.json"

    def run(text: str) -> list[bool]:
        config_file.write_text(text)
        proc = _py(code, env)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert run("") == [False, True]  # the miss that stores it
    assert run("") == [True, True]
    assert run("recache = true\n") == [False, True]
    assert run("disable = true\n") == [False, False]
    assert run(f"record = {json.dumps(str(lock))}\n") == [True, True] and lock.read_text().strip()
