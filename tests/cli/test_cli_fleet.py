"""``kernelcache stats`` for people who run a fleet: Prometheus's text format, the fleet's counters
per host, and what it shows when a tier is down. Real redis-server, real processes, and real
host names (each "host" is a process in its own UTS namespace, where it sets its host name)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import ARCH
from redis_servers import REDIS_CLI

pytest.importorskip("redis")

_WORK = textwrap.dedent(
    """
    import os, sys
    from cuda.core import ProgramOptions
    from kernelcache import FileStreamProgramCache, RedisProgramCache, TieredProgramCache, compile_program
    tiers = [FileStreamProgramCache(os.environ["KERNELCACHE_DIR"])]
    if os.environ.get("KERNELCACHE_REDIS_URL"):
        tiers.append(RedisProgramCache(os.environ["KERNELCACHE_REDIS_URL"], namespace=sys.argv[3]))
    with TieredProgramCache(tiers) as cache:
        for i in range(int(sys.argv[2])):
            src = '__global__ void k%d(float* x) { x[0] = %d; }' % (i, i)
            compile_program(src, options=ProgramOptions(arch=sys.argv[1]), cache=cache)
    """
)


def _kc(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, timeout=120, env=env
    )


def _work(env: dict[str, str], n: int, host: str | None = None) -> None:
    """Compile n kernels in a new process (as host ``host``), counting into namespace env["NS"]."""
    cmd = [sys.executable, "-c", _WORK, ARCH, str(n), env["NS"]]
    if host is not None:
        # A host of its own: a UTS namespace where this process's host name is `host`.
        cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr


def _can_rename_host() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--uts", "hostname", "kc-probe"], capture_output=True).returncode == 0


@pytest.fixture
def fleet_env(server, tmp_path) -> dict[str, str]:
    ns = f"fleet{os.getpid()}{time.monotonic_ns()}"
    env = {**os.environ, "KERNELCACHE_REDIS_URL": server.url, "KERNELCACHE_DIR": str(tmp_path / "cache")}
    env["NS"] = ns
    return env


def test_prometheus_output_parses_and_matches_the_json(server, fleet_env) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    env = fleet_env
    _work(env, 3)
    _work(env, 3)  # hits from disk
    args = ("stats", "--redis", server.url, "--redis-namespace", env["NS"], "--by-host")
    text = _kc(*args, "--format", "prometheus", env=env)
    assert text.returncode == 0, text.stderr
    families = {f.name: f for f in text_string_to_metric_families(text.stdout)}
    as_json = json.loads(_kc(*args, "--json", env=env).stdout)
    samples = {(s.name, s.labels.get("tier")): s.value for f in families.values() for s in f.samples}
    assert samples[("kernelcache_hits_total", "disk")] == as_json["disk"]["hits"] == 3
    assert samples[("kernelcache_compiles_total", "disk")] == 3
    assert samples[("kernelcache_size_bytes", "disk")] == as_json["disk"]["size_bytes"] > 0
    assert samples[("kernelcache_entries", "disk")] == 3
    assert samples[("kernelcache_fleet_hits_total", None)] == as_json["fleet"]["hits"]  # once, under its own name
    assert families["kernelcache_hits"].type == "counter" and families["kernelcache_size_bytes"].type == "gauge"
    hosts = {s.labels["host"] for s in families["kernelcache_fleet_host_hits"].samples}
    assert hosts == set(as_json["fleet"]["hosts"]) and len(hosts) >= 1


@pytest.mark.skipif(not _can_rename_host(), reason="needs unshare --uts (root) to give a process its own host name")
def test_the_fleet_counters_are_kept_per_host_and_a_silent_host_drops_out(server, fleet_env) -> None:
    ns, root = fleet_env["NS"], fleet_env["KERNELCACHE_DIR"]
    for disk, host in (("-a", "kc-host-a"), ("-a2", "kc-host-a"), ("-b", "kc-host-b")):
        _work({**fleet_env, "KERNELCACHE_DIR": root + disk}, 2, host)  # each its own empty disk
    args = ("stats", "--redis", server.url, "--redis-namespace", ns, "--by-host", "--json")
    out = json.loads(_kc(*args, env=fleet_env).stdout)["fleet"]
    hosts = out["hosts"]
    assert sorted(hosts) == ["kc-host-a", "kc-host-b"]
    assert hosts["kc-host-a"]["processes"] == 2 and hosts["kc-host-b"]["processes"] == 1
    assert hosts["kc-host-a"]["compiles"] + hosts["kc-host-b"]["compiles"] == out["compiles"] == 2
    assert hosts["kc-host-a"]["hits"] + hosts["kc-host-b"]["hits"] == out["hits"] == 4
    # kc-host-b last sent two days ago (its score in the hosts set, as time would leave it).
    old = str(time.time() - 2 * 86400)
    zadd = [REDIS_CLI, "-p", str(server.port), "zadd", f"{ns}:stats:hosts", old, "kc-host-b"]
    subprocess.run(zadd, check=True, capture_output=True)
    later = json.loads(_kc(*args, env=fleet_env).stdout)["fleet"]
    assert sorted(later["hosts"]) == ["kc-host-a"]
    assert (later["hits"], later["compiles"]) == (4, 2)  # out of the breakdown, not out of the totals


def test_stats_shows_the_disk_when_redis_is_down_and_exits_0(fleet_env) -> None:
    _work({k: v for k, v in fleet_env.items() if k != "KERNELCACHE_REDIS_URL"}, 1)
    env = {**fleet_env, "KERNELCACHE_REDIS_URL": "redis://127.0.0.1:1/0"}
    proc = _kc("stats", env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("compiles") and line.split()[1] == "1" for line in lines), proc.stdout
    assert [line for line in lines if "was not reached" in line] == [
        next(line for line in lines if line.startswith("Redis at redis://127.0.0.1:1/0 was not reached"))
    ]


def test_stats_of_redis_alone_needs_no_cache_directory(server, fleet_env) -> None:
    env = {**fleet_env, "KERNELCACHE_DIR": str(fleet_env["KERNELCACHE_DIR"]) + "-never-made"}
    _work({**env, "KERNELCACHE_DIR": env["KERNELCACHE_DIR"] + "-other"}, 1)
    proc = _kc("stats", "--redis", server.url, "--redis-namespace", env["NS"], "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert "disk" not in data and data["fleet"]["compiles"] >= 1
    assert any("no cache directory" in note for note in data["notes"])
    assert not os.path.exists(env["KERNELCACHE_DIR"])


def test_a_namespace_never_written_says_so(server, fleet_env) -> None:
    proc = _kc("stats", "--redis", server.url, "--redis-namespace", "never-written-" + fleet_env["NS"], env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    assert "has never been written" in proc.stdout


def test_stats_fails_only_when_nothing_could_be_read(tmp_path) -> None:
    env = {**os.environ, "KERNELCACHE_DIR": str(tmp_path / "none"), "KERNELCACHE_REDIS_URL": "redis://127.0.0.1:1/0"}
    proc = _kc("stats", env=env)
    assert proc.returncode == 2
    assert "was not reached" in proc.stderr and "no cache directory" in proc.stderr


def test_the_fleet_counts_errors_by_cause_per_host(tmp_path, fleet_env) -> None:
    """A record damaged in Redis (corrupt) and a SIGSTOPped redis-server (unreachable): each
    lands under its cause in the fleet's totals and in this host's breakdown."""
    import socket
    import warnings

    import redis
    from prometheus_client.parser import text_string_to_metric_families
    from redis_servers import RedisServer

    from kernelcache import RedisProgramCache

    s, ns = RedisServer(str(tmp_path / "redis")), fleet_env["NS"]
    try:
        rc = RedisProgramCache(s.url, namespace=ns, socket_timeout=0.3, retry_after_s=0.2)
        rc["k"] = b"A" * 100
        raw = redis.Redis.from_url(s.url)
        (rk,) = list(raw.scan_iter(match=f"{ns}:e:*"))
        raw.setrange(rk, raw.get(rk).index(b"A" * 100) + 50, b"B")  # a byte of the payload
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert rc.get("k") is None  # corrupt
            s.pause()
            try:
                assert rc.get("other") is None  # unreachable: one socket timeout
            finally:
                s.resume()
            time.sleep(0.5)  # past the back-off: the tally may be sent
            rc.close()
        args = ("stats", "--redis", s.url, "--redis-namespace", ns, "--by-host")
        text = _kc(*args, "--format", "prometheus", env=fleet_env)
        assert text.returncode == 0, text.stderr
        families = {f.name: f for f in text_string_to_metric_families(text.stdout)}
        fleet = json.loads(_kc(*args, "--json", env=fleet_env).stdout)["fleet"]
    finally:
        s.stop()
    by_cause = fleet["errors_by_cause"]
    assert sorted(by_cause) == ["corrupt", "unreachable"] and by_cause["corrupt"] == 1
    assert fleet["errors"] == sum(by_cause.values()) >= 2  # the sender may have met the stopped server too
    fleet_errors = {x.labels["cause"]: x.value for x in families["kernelcache_fleet_errors"].samples}
    assert {cause: n for cause, n in fleet_errors.items() if n} == by_cause and len(fleet_errors) == 11  # zeros too
    hosts = families["kernelcache_fleet_host_errors"]
    assert {(x.labels["host"], x.labels["cause"]): x.value for x in hosts.samples if x.value} == {
        (socket.gethostname(), cause): n for cause, n in by_cause.items()
    }
