"""Every kernelcache command through the real entry point, on real cache directories."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from helpers import EXAMPLE, REPO, kc

from kernelcache import FileStreamProgramCache
from kernelcache.stores.file.store import FORMAT_DIR

ROOT = REPO


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> str:
    cache = str(tmp_path_factory.mktemp("cli-cache"))
    kc("warm", EXAMPLE, "-j", "2", cache=cache)
    return cache


def test_console_script_is_installed() -> None:
    import shutil

    exe = shutil.which("kernelcache")
    if exe is None:
        pytest.skip("the kernelcache script is not on PATH (package not installed with pip)")
    assert subprocess.run([exe, "--help"], capture_output=True, text=True).returncode == 0


def test_demo_cpu_path_miss_then_hit(tmp_path) -> None:
    cache = str(tmp_path)
    first = json.loads(kc("demo", "--json", "--m", "64", "--n", "64", "--k", "64", cache=cache).stdout)
    second = kc("demo", "--m", "64", "--n", "64", "--k", "64", cache=cache).stdout
    if first["device"] is None:
        assert first["cache_status"] == "MISS" and first["compile_ms"] > 0
        assert "No CUDA GPU available" in second
    assert "cache status: HIT" in second and "compile: skipped" in second
    assert first["key_prefix"] in second
    other = json.loads(kc("demo", "--json", "--tile-size", "32", "--epilogue", "gelu", cache=cache).stdout)
    assert other["cache_status"] == "MISS" and other["key_prefix"] != first["key_prefix"]
    cleared = json.loads(kc("demo", "--json", "--clear-cache", cache=cache).stdout)
    assert cleared["cache_status"] == "MISS"


def test_warm_example_from_the_readme(warm_cache) -> None:
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    with open(EXAMPLE) as f:
        assert f.read() in readme  # the README shows exactly the manifest the tests run
    again = json.loads(kc("warm", EXAMPLE, "--json", cache=warm_cache).stdout)
    # saxpy x (cubin, ptx) at sm_90 + axpy x (sm_80, sm_90) cubin = 4 compiles, now all hits
    assert len(again) == 4 and all(r["hit"] for r in again)


def test_stats_ls_show_export(warm_cache, tmp_path) -> None:
    stats = json.loads(kc("stats", "--json", cache=warm_cache).stdout)["disk"]
    assert stats["entries"] == 4 and stats["compiles"] == 4 and stats["hits"] >= 4
    assert "hit_rate" in kc("stats", cache=warm_cache).stdout
    rows = json.loads(kc("ls", "--json", "--sort", "size", cache=warm_cache).stdout)
    assert len(rows) == 4 and rows[0]["size"] >= rows[-1]["size"]
    assert {tuple(r["kernels"]) for r in rows} >= {("saxpy",), ("axpy<float>", "axpy<double>")}
    assert len(json.loads(kc("ls", "--json", "--limit", "2", cache=warm_cache).stdout)) == 2
    cubin = next(r for r in rows if r["target_type"] == "cubin" and r["kernels"] == ["saxpy"])
    shown = json.loads(kc("show", cubin["key"][:12], "--json", cache=warm_cache).stdout)
    assert shown["meta"]["toolchain"]["compiler"].startswith("libnvrtc.so")  # the file that compiled: name;size;build id
    shown_text = kc("show", cubin["key"][:12], cache=warm_cache).stdout
    assert f"key: {cubin['key']}" in shown_text and "options:" in shown_text and "  std = c++17" in shown_text
    out = tmp_path / "saxpy.cubin"
    kc("export", cubin["key"][:12], "-o", str(out), cache=warm_cache)
    assert out.read_bytes()[:4] == b"\x7fELF" and len(out.read_bytes()) == cubin["size"]


def test_bad_input_is_one_line_and_non_zero(warm_cache, tmp_path) -> None:
    assert "no entry with key prefix" in one_error_line(kc("show", "ffffffffffff", cache=warm_cache, check=False))
    assert "bad key prefix" in one_error_line(kc("show", "", cache=warm_cache, check=False))
    # 17 entries: two of them share a first hex digit (pigeonhole), so that prefix is ambiguous.
    crowded = str(tmp_path / "crowded")
    with FileStreamProgramCache(crowded) as store:
        for i in range(17):
            store[f"entry-{i}"] = b"x"
    firsts = [r["key"][0] for r in json.loads(kc("ls", "--json", cache=crowded).stdout)]
    dup = next(c for c in set(firsts) if firsts.count(c) > 1)
    assert "is ambiguous" in one_error_line(kc("show", dup, cache=crowded, check=False))
    assert "bad key prefix" in one_error_line(kc("show", "xyz!", cache=warm_cache, check=False))
    assert "bad size" in one_error_line(kc("prune", "--max-size", "2 lightyears", cache=warm_cache, check=False))
    assert "bad age" in one_error_line(kc("prune", "--older-than", "soon", cache=warm_cache, check=False))
    assert "cannot read manifest" in one_error_line(kc("warm", str(tmp_path / "missing.toml"), check=False))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not valid JSON" in one_error_line(kc("warm", str(broken), check=False))
    nokernels = tmp_path / "empty.toml"
    nokernels.write_text("[defaults]\narch = 'sm_90'\n")
    assert "no kernels" in one_error_line(kc("warm", str(nokernels), check=False))


def test_verify_finds_and_fixes_corruption(tmp_path) -> None:
    cache = str(tmp_path / "c")
    kc("warm", EXAMPLE, cache=cache)
    assert json.loads(kc("verify", "--json", cache=cache).stdout)["remaining"] == 0
    entries = [
        os.path.join(d, f)
        for d, _, fs in os.walk(os.path.join(cache, FORMAT_DIR, "entries"))
        for f in fs
        if not f.endswith(".meta")
    ]
    victim = entries[0]
    with open(victim, "r+b") as f:
        f.seek(10)
        f.write(b"\x00\xff\x00")
    # older than the scan: verify judges a file written just before it as possibly in flight
    os.utime(victim, (time.time() - 60, time.time() - 60))
    orphan = entries[1] + ".meta"
    os.unlink(entries[1])  # its sidecar is now an orphan
    stale = os.path.join(cache, FORMAT_DIR, "tmp", "dead.tmp")
    with open(stale, "wb") as f:
        f.write(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    found = kc("verify", "--json", cache=cache, check=False)
    assert found.returncode == 1
    report = json.loads(found.stdout)
    assert len(report["corrupt"]) >= 1 and report["orphaned_sidecars"] == [orphan] and report["stale_temps"] == [stale]
    fixed = kc("verify", "--fix", cache=cache, check=False)
    assert fixed.returncode == 0 and "OK" in fixed.stdout
    assert json.loads(kc("verify", "--json", cache=cache).stdout)["remaining"] == 0


def test_prune_and_clear(tmp_path) -> None:
    cache = str(tmp_path / "c")
    kc("warm", EXAMPLE, cache=cache)
    rows = json.loads(kc("ls", "--json", cache=cache).stdout)
    keep = rows[-1]
    time.sleep(0.05)
    kc("export", keep["key"][:16], "-o", str(tmp_path / "read.bin"), cache=cache)  # now the most recently used
    path = json.loads(kc("show", keep["key"][:16], "--json", cache=cache).stdout)["path"]
    cap = os.path.getsize(path) + os.path.getsize(path + ".meta")
    pruned = json.loads(kc("prune", "--max-size", f"{cap}B", "--json", cache=cache).stdout)
    assert pruned["removed"] == 3  # least recently used first, down to the cap
    assert [r["key"] for r in json.loads(kc("ls", "--json", cache=cache).stdout)] == [keep["key"]]
    assert json.loads(kc("prune", "--older-than", "0s", "--json", cache=cache).stdout)["removed"] == 1
    kc("warm", EXAMPLE, cache=cache)
    refused = kc("clear", cache=cache, check=False)  # no terminal: the question is answered "no"
    assert refused.returncode != 0 and len(json.loads(kc("ls", "--json", cache=cache).stdout)) == 4
    assert "removed 4 entries" in kc("clear", "--yes", cache=cache).stdout
    assert json.loads(kc("ls", "--json", cache=cache).stdout) == []
    assert "--max-size" in one_error_line(kc("prune", cache=cache, check=False))


def test_explain_names_the_differing_component(tmp_path, warm_cache) -> None:
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    kernel = {"name": "k", "code": 'extern "C" __global__ void k() {}', "arch": "sm_90"}
    a.write_text(json.dumps({"kernel": [kernel]}))
    b.write_text(json.dumps({"kernel": [{**kernel, "options": {"use_fast_math": True}}]}))
    diff = json.loads(kc("explain", str(a), str(b), "--json").stdout)["differences"]
    assert list(diff) == ["options.use_fast_math"]
    text = kc("explain", str(a), str(b)).stdout
    assert "options.use_fast_math" in text
    # One description and the cache: why did this miss?
    saxpy80 = tmp_path / "saxpy80.toml"
    with open(EXAMPLE) as f:
        saxpy80.write_text(re.sub(r'arch = \["sm_90"\]', 'arch = ["sm_80"]', f.read(), count=1))
    os.symlink(os.path.join(ROOT, "examples", "saxpy.cu"), tmp_path / "saxpy.cu")
    missed = kc("explain", str(saxpy80), "--entry", "saxpy", "--json", cache=warm_cache, check=False)
    assert missed.returncode == 1  # not in the cache: usable in CI
    result = json.loads(missed.stdout)
    assert result["in_cache"] is False
    assert "options.arch" in result["differences"]
    hit = json.loads(kc("explain", EXAMPLE, "--entry", "saxpy", "--json", cache=warm_cache).stdout)
    assert hit["in_cache"] is True


def test_explain_prints_the_key_the_store_uses(tmp_path) -> None:
    # A C++ entry is stored under source+options+headers; explain must print that entry's
    # name (the prefix ls prints and show accepts), never the source+options key alone.
    cache = str(tmp_path / "c")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "v.h").write_text("#define V 1\n")
    kernel = {
        "name": "k",
        "code": '#include "v.h"\nextern "C" __global__ void k(int* x) { x[0] = V; }',
        "options": {"include_path": [str(tmp_path / "inc")]},
    }
    desc = tmp_path / "k.json"
    desc.write_text(json.dumps({"kernel": [kernel]}))
    before = json.loads(kc("explain", str(desc), "--json", cache=cache, check=False).stdout)  # nothing cached yet
    assert before["in_cache"] is False and before["key"] is None
    kc("warm", str(desc), cache=cache)
    names = [row["key"] for row in json.loads(kc("ls", "--json", cache=cache).stdout)]
    hit = json.loads(kc("explain", str(desc), "--json", cache=cache).stdout)
    assert hit["in_cache"] is True and hit["key"] in names
    assert kc("explain", str(desc), cache=cache).stdout.startswith(f"key {hit['key'][:16]}: in the cache")
    kc("show", hit["key"][:16], cache=cache)  # the printed prefix is one show accepts
    (tmp_path / "inc" / "v.h").write_text("#define V 2\n")  # the header changed: a miss
    miss = json.loads(kc("explain", str(desc), "--json", cache=cache, check=False).stdout)
    assert miss["in_cache"] is False and miss["key"] is None and miss["closest"] == hit["key"][:16]


def test_stats_with_a_redis_store(tmp_path) -> None:
    pytest.importorskip("redis")
    from redis_servers import RedisServer, need_redis

    need_redis()
    server = RedisServer(str(tmp_path))
    try:
        from kernelcache import RedisProgramCache

        RedisProgramCache(server.url)["k"] = b"v"
        os.makedirs(tmp_path / "c")  # stats reads an existing cache; it creates none
        data = json.loads(kc("stats", "--redis", server.url, "--json", cache=str(tmp_path / "c")).stdout)
        assert data["fleet"]["entries"] == 1 and data["fleet"]["url"] == server.url
        assert "redis" in kc("stats", "--redis", server.url, cache=str(tmp_path / "c")).stdout
    finally:
        server.stop()
