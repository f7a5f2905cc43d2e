"""Every tier's hits and misses counted where ``kernelcache stats``, ``--json`` and Prometheus read
them, and a Prometheus exposition a fleet can sum: this node's counts per tier, the fleet's
totals once under names of their own, every series from the first scrape, a reachable gauge per
tier, and a node with no cache yet. Real compiles in fresh processes, a real redis-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import ARCH

from kernelcache.stats import ERROR_CAUSES

SOURCES = [f'extern "C" __global__ void t{i}(float* x) {{ x[0] = {i}.25f; }}' for i in range(2)]
_COMPILE = textwrap.dedent(
    """
    import json, sys
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, compile_program
    hits = []
    for src in json.loads(sys.argv[1]):
        info = CompileInfo()
        compile_program(src, options=ProgramOptions(arch=sys.argv[2]), info=info)
        hits.append(info.hit)
    print(json.dumps(hits))
    """
)


def _run(env: dict[str, str], sources: list[str]) -> list[bool]:
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps(sources), ARCH],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _kc(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], env={**os.environ, **env}, capture_output=True, text=True
    )


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_bundle_hits_are_counted_in_stats_json_and_prometheus(tmp_path: Path) -> None:
    """Two hits served by a bundle in the default cache: counted in the bundle tier (and as misses
    in the memory tier before it), in stats' text, its JSON and Prometheus alike."""
    build = {"KERNELCACHE_DIR": str(tmp_path / "build")}
    assert _run(build, SOURCES) == [False, False]
    assert _kc("bundle", "create", str(tmp_path / "b.kcb"), env=build).returncode == 0
    node = {"KERNELCACHE_DIR": str(tmp_path / "node"), "KERNELCACHE_BUNDLES": str(tmp_path / "b.kcb")}
    assert _run(node, SOURCES) == [True, True]
    data = json.loads(_kc("stats", "--json", env=node).stdout)
    assert (data["bundle"]["hits"], data["bundle"]["misses"]) == (2, 0)
    assert (data["memory"]["hits"], data["memory"]["misses"]) == (0, 2)
    assert (data["disk"]["hits"], data["disk"]["misses"]) == (0, 0)  # the bundle answered first
    text = _kc("stats", env=node).stdout
    header = next(line for line in text.splitlines() if line.startswith("counter"))
    assert header.split() == ["counter", "disk", "memory", "bundle"]
    hits = next(line for line in text.splitlines() if line.split()[:1] == ["hits"])
    assert hits.split() == ["hits", "0", "0", "2"]
    samples = _samples(_kc("stats", "--format", "prometheus", env=node).stdout)
    assert samples[("kernelcache_hits_total", (("tier", "bundle"),))] == 2
    assert samples[("kernelcache_tier_up", (("tier", "bundle"),))] == 1


def test_prometheus_series_of_nodes_sum_to_the_fleet_and_the_fleet_is_exported_once(tmp_path: Path, server) -> None:
    """Two nodes (their own cache directories) sharing a Redis namespace: each exports its own
    look-ups in Redis as tier="redis"; summed over the nodes they are the fleet's totals, which
    each exports under kernelcache_fleet_* (the same value from both: never to be summed)."""
    redis = {"KERNELCACHE_REDIS_URL": server.url}  # the default namespace, of this module's own server
    nodes = [{**redis, "KERNELCACHE_DIR": str(tmp_path / name)} for name in ("a", "b")]
    assert _run(nodes[0], SOURCES) == [False, False]
    assert _run(nodes[1], SOURCES) == [True, True]  # from Redis: b's disk is empty
    scrapes = []
    for env in nodes:
        proc = _kc("stats", "--redis-namespace", "kernelcache", "--format", "prometheus", env=env)
        assert proc.returncode == 0, proc.stderr
        scrapes.append(_samples(proc.stdout))
    redis_hits = [s[("kernelcache_hits_total", (("tier", "redis"),))] for s in scrapes]
    fleet_hits = {s[("kernelcache_fleet_hits_total", (("namespace", "kernelcache"),))] for s in scrapes}
    assert redis_hits == [0, 2] and fleet_hits == {sum(redis_hits)}
    redis_misses = [s[("kernelcache_misses_total", (("tier", "redis"),))] for s in scrapes]
    fleet_misses = {s[("kernelcache_fleet_misses_total", (("namespace", "kernelcache"),))] for s in scrapes}
    assert fleet_misses == {sum(redis_misses)} == {2}
    assert all(s[("kernelcache_tier_up", (("tier", "redis"),))] == 1 for s in scrapes)


def test_every_series_is_there_from_the_first_scrape_of_a_node_with_no_cache(tmp_path: Path) -> None:
    """A node that never ran a kernel (no cache directory) scrapes fine: every family of every tier
    it has, every error cause, zeros; the Redis it cannot reach is up 0; nothing is created."""
    root = tmp_path / "never-made"
    env = {"KERNELCACHE_DIR": str(root), "KERNELCACHE_REDIS_URL": "redis://127.0.0.1:1/0"}
    proc = _kc("stats", "--format", "prometheus", env=env)
    assert proc.returncode == 0, proc.stderr
    samples = _samples(proc.stdout)
    for tier in ("disk", "memory", "redis"):
        for family in ("hits", "misses", "compiles", "stores", "evictions", "compile_seconds_saved"):
            assert samples[(f"kernelcache_{family}_total", (("tier", tier),))] == 0, (family, tier)
        for cause in (*ERROR_CAUSES, "other"):
            assert samples[("kernelcache_errors_total", (("cause", cause), ("tier", tier)))] == 0
    assert samples[("kernelcache_tier_up", (("tier", "disk"),))] == 1
    assert samples[("kernelcache_tier_up", (("tier", "redis"),))] == 0
    assert samples[("kernelcache_entries", (("tier", "disk"),))] == 0
    assert not root.exists()


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty-config.toml").write_text("")  # no user's config file reaches these processes
    monkeypatch.setenv("KERNELCACHE_CONFIG", str(tmp_path / "empty-config.toml"))
    monkeypatch.delenv("KERNELCACHE_REDIS_URL", raising=False)
