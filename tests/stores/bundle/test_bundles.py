"""Bundles: a cache as one read-only file (create, ls, verify, import, KERNELCACHE_BUNDLES).

Real compiles, real files, real processes (the CLI and fresh interpreters), a real
redis-server. The other-uid and read-only-mount cases are test_bundles_uids.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
from cuda.core import ProgramOptions
from helpers import run_python, settle_timestamps, support_script

import kernelcache
from kernelcache import config
from kernelcache.stores.bundle import format as fmt

SOURCES = [f'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}.0f; }}' for i in range(3)]
# What _fill stores: 4 artifacts, 1 header manifest and the header variant it names, the
# preprocessing hint of the one header pass (compile.tracing), and, per source, its source-index
# record (for explained misses): every record of the store, whatever its kind.
RECORDS = 4 + 2 + 1 + 4
HEADER_SOURCE = '#include "conf.h"\nextern "C" __global__ void h(float* x) { x[0] = CONF; }'


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=full)


def _fill(root: Path, inc: Path) -> list[str]:
    """Real compiles into the cache at root (three plain kernels, one with a header); their entry names."""
    inc.mkdir(exist_ok=True)
    (inc / "conf.h").write_text("#define CONF 7.0f\n")
    settle_timestamps()
    names = []
    with kernelcache.FileStreamProgramCache(root) as cache:
        for src in SOURCES:
            info = kernelcache.CompileInfo()
            kernelcache.compile_program(src, options=ProgramOptions(arch="sm_90"), cache=cache, info=info)
            names.append(info.entry_name)
        info = kernelcache.CompileInfo()
        opts = ProgramOptions(arch="sm_90", include_path=[str(inc)])
        kernelcache.compile_program(HEADER_SOURCE, options=opts, cache=cache, info=info)
        names.append(info.entry_name)
    return names


@pytest.fixture
def bundle(tmp_path: Path) -> dict:
    names = _fill(tmp_path / "cache", tmp_path / "inc")
    proc = _cli("bundle", "create", str(tmp_path / "b.kcb"), "--cache-dir", str(tmp_path / "cache"), "--json")
    assert proc.returncode == 0, proc.stderr
    return {"path": tmp_path / "b.kcb", "names": names, "inc": tmp_path / "inc", "report": json.loads(proc.stdout)}


def test_every_record_is_carried_header_manifests_included(bundle):
    assert bundle["report"]["records"] == RECORDS
    with kernelcache.BundleProgramCache(bundle["path"]) as store:
        assert len(store) == RECORDS and store.read_only and not store.signed
        assert set(bundle["names"]) <= set(store.names())
        hits = []
        for src in SOURCES:
            info = kernelcache.CompileInfo()
            kernelcache.compile_program(src, options=ProgramOptions(arch="sm_90"), cache=store, info=info)
            hits.append(info.hit)
        info = kernelcache.CompileInfo()
        opts = ProgramOptions(arch="sm_90", include_path=[str(bundle["inc"])])
        kernelcache.compile_program(HEADER_SOURCE, options=opts, cache=store, info=info)
        assert hits == [True] * 3 and info.hit and store.stats()["compiles"] == 0
        # An edited header is a miss (tracked by content, never a stale hit), compiled, not stored.
        (bundle["inc"] / "conf.h").write_text("#define CONF 8.0f\n")
        settle_timestamps()
        info = kernelcache.CompileInfo()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "failed to write": a read-only store is not written
            kernelcache.compile_program(HEADER_SOURCE, options=opts, cache=store, info=info)
        assert not info.hit and store.stats()["compiles"] == 1 and len(store) == RECORDS


def test_writes_raise_a_clear_error(bundle):
    with kernelcache.BundleProgramCache(bundle["path"]) as store:
        for write in (
            lambda: store.__setitem__(b"k", b"v"),
            lambda: store.set_record(b"k", b"v", {}),
            lambda: store.__delitem__(b"k"),
            store.clear,
        ):
            with pytest.raises(PermissionError, match="BundleProgramCache is read-only"):
                write()
        assert store.get(b"absent") is None


def test_ls_lists_the_artifacts_and_counts_the_rest(bundle):
    proc = _cli("bundle", "ls", str(bundle["path"]), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert sorted(r["key"] for r in data["rows"]) == sorted(bundle["names"])
    assert data["other_records"] == RECORDS - 4 and data["records"] == RECORDS and data["kernels"] == 4 and data["signed"] is False
    assert {r["kernels"][0] for r in data["rows"]} == {"k0", "k1", "k2", "h"}
    text = _cli("bundle", "ls", str(bundle["path"]))
    assert text.returncode == 0 and "kernelcache entries (4)" in text.stdout
    assert all(r["last_used"] == r["created"] and r["created"] > 0 for r in data["rows"])


def test_a_damaged_index_refuses_the_bundle_and_verify_says_so(bundle):
    raw = bytearray(bundle["path"].read_bytes())
    raw[fmt.HEADER.unpack_from(raw)[5] + 40] ^= 0xFF  # inside the first slot's offset field
    bundle["path"].write_bytes(bytes(raw))
    with pytest.raises(fmt.InvalidBundleError, match="index fails its check"):
        kernelcache.BundleProgramCache(bundle["path"])
    proc = _cli("bundle", "verify", str(bundle["path"]))
    assert proc.returncode == 2 and "index fails its check" in proc.stderr


def test_not_a_bundle_and_a_truncated_one_are_named(tmp_path, bundle):
    other = tmp_path / "x.kcb"
    other.write_bytes(b"hello")
    with pytest.raises(fmt.InvalidBundleError, match="not a kernelcache bundle"):
        kernelcache.BundleProgramCache(other)
    other.write_bytes(bundle["path"].read_bytes()[:-10])
    with pytest.raises(fmt.InvalidBundleError, match="truncated"):
        kernelcache.BundleProgramCache(other)


def test_bundles_tier_serves_first_and_is_not_copied_to_disk(bundle, tmp_path):
    disk = tmp_path / "fresh-disk"
    code = (
        "import json, sys, kernelcache\n"
        "from cuda.core import ProgramOptions\n"
        "hits = []\n"
        "for src in json.loads(sys.argv[1]):\n"
        "    info = kernelcache.CompileInfo()\n"
        "    kernelcache.compile_program(src, options=ProgramOptions(arch='sm_90'), info=info)\n"
        "    hits.append(info.hit)\n"
        "c = kernelcache.default_cache()\n"
        "print(json.dumps([hits, [type(t).__name__ for t in c.tiers], [t.stats().get('stores', 0) for t in c.tiers]]))\n"
    )
    new = 'extern "C" __global__ void fresh(float* x) { x[0] = 42.0f; }'
    env = {"KERNELCACHE_DIR": str(disk), "KERNELCACHE_BUNDLES": str(bundle["path"])}
    hits, tiers, stores = json.loads(run_python(code, json.dumps([*SOURCES, new]), env=env))
    assert hits == [True, True, True, False]
    assert tiers == ["InMemoryProgramCache", "BundleProgramCache", "FileStreamProgramCache"]
    with kernelcache.FileStreamProgramCache(disk) as store:
        assert len(store) == 2  # only the miss (and its source index); the bundle's hits stayed in the bundle
    assert stores == [1, 0, 1]


def test_the_bundles_variable_is_checked(tmp_path, monkeypatch, bundle):
    for bad, why in (
        ("relative.kcb", "relative path"),
        (f"{bundle['path']}::{bundle['path']}", "empty or space-padded"),
    ):
        monkeypatch.setenv("KERNELCACHE_BUNDLES", bad)
        with pytest.raises(config.ConfigError, match=why):
            config.bundles()
    monkeypatch.setenv("KERNELCACHE_BUNDLES", f"{bundle['path']}{os.pathsep}{bundle['path']}")
    assert config.bundles() == (str(bundle["path"]),) * 2


def test_a_bundle_that_cannot_be_used_is_left_out_with_one_warning(tmp_path, monkeypatch):
    broken = tmp_path / "broken.kcb"
    broken.write_bytes(b"not a bundle at all")
    monkeypatch.setenv("KERNELCACHE_BUNDLES", str(broken))
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "disk"))
    with pytest.warns(kernelcache.KernelCacheWarning, match="broken.kcb .* is not used"):
        cache = kernelcache.default_cache()
    assert [type(t).__name__ for t in cache.tiers] == ["InMemoryProgramCache", "FileStreamProgramCache"]


def test_import_into_a_cache_dir_then_a_fresh_process_hits_from_disk(bundle, tmp_path):
    target = tmp_path / "imported"
    proc = _cli("import", str(bundle["path"]), "--cache-dir", str(target), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records"] == RECORDS
    code = (
        "import json, sys, kernelcache\n"
        "from cuda.core import ProgramOptions\n"
        "c = kernelcache.FileStreamProgramCache(sys.argv[2])\n"
        "out = []\n"
        "for src in json.loads(sys.argv[1]):\n"
        "    info = kernelcache.CompileInfo()\n"
        "    kernelcache.compile_program(src, options=ProgramOptions(arch='sm_90'), cache=c, info=info)\n"
        "    out.append(info.hit)\n"
        "print(json.dumps(out))\n"
    )
    assert json.loads(run_python(code, json.dumps(SOURCES), str(target))) == [True, True, True]
    verify = _cli("verify", "--cache-dir", str(target), "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["corrupt"] == []


def test_redis_round_trip_import_then_bundle_create_from_redis(bundle, tmp_path, server):
    url = server.url
    proc = _cli("import", str(bundle["path"]), "--redis", url, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records"] == RECORDS
    again = tmp_path / "from-redis.kcb"
    proc = _cli("bundle", "create", str(again), "--redis", url, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records"] == RECORDS
    with kernelcache.BundleProgramCache(bundle["path"]) as first, kernelcache.BundleProgramCache(again) as second:
        assert list(first.names()) == list(second.names())
        for name in first.names():
            assert first.check_named(name) == second.check_named(name)  # artifact and metadata


def test_signed_bundle_every_signature_checked_by_verify(bundle, tmp_path):
    env = {"KC_BUNDLE_KEY": "team-secret"}
    signed = tmp_path / "signed.kcb"
    proc = _cli("bundle", "create", str(signed), "--cache-dir", str(tmp_path / "cache"), "--secret-env", "KC_BUNDLE_KEY")
    assert proc.returncode == 2 and "KC_BUNDLE_KEY is not set" in proc.stderr
    args = ["bundle", "create", str(signed), "--cache-dir", str(tmp_path / "cache"), "--secret-env", "KC_BUNDLE_KEY"]
    assert _cli(*args, env=env).returncode == 0
    ok = _cli("bundle", "verify", str(signed), "--secret-env", "KC_BUNDLE_KEY", env=env)
    assert ok.returncode == 0 and "0 damaged" in ok.stdout
    wrong = _cli("bundle", "verify", str(signed), "--secret-env", "KC_BUNDLE_KEY", env={"KC_BUNDLE_KEY": "nope"})
    assert wrong.returncode == 2 and "another secret" in wrong.stderr


def test_create_replaces_a_bundle_atomically_under_readers(bundle, tmp_path):
    # Race: `bundle create` renames the new file over the one readers open. A reader must
    # open the old bundle or the new one, whole, never a part: open it in a loop meanwhile.
    target = tmp_path / "live.kcb"
    target.write_bytes(bundle["path"].read_bytes())
    stop, seen, errors = threading.Event(), [0], []

    def read_loop() -> None:
        while not stop.is_set():
            try:
                with kernelcache.BundleProgramCache(target) as store:
                    assert len(store) == RECORDS
                    for name in store.names():
                        assert store.check_named(name)[0] is None
                seen[0] += 1
            except Exception as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(repr(exc))

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        for _ in range(8):
            proc = _cli("bundle", "create", str(target), "--cache-dir", str(tmp_path / "cache"))
            assert proc.returncode == 0, proc.stderr
    finally:
        stop.set()
        reader.join()
    assert errors == [] and seen[0] > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".live.kcb")] == []  # no staged leftovers


def test_a_real_triton_kernel_is_served_from_a_bundle_alone(tmp_path):
    # Triton groups (IRs, cubin, metadata, the group file) are records like any other.
    pytest.importorskip("triton")
    child = support_script("_integration_gpu_child.py")

    def compile_triton(kc_dir: Path, **extra: str) -> dict:
        env = {
            **os.environ,
            "KERNELCACHE_DIR": str(kc_dir),
            "TRITON_CACHE_MANAGER": "kernelcache.triton:KernelCacheManager",
            "TRITON_CACHE_DIR": str(tmp_path / "triton-own"),  # must stay unused
            "TRITON_DEFAULT_FP_FUSION": "1",
            **extra,
        }
        proc = subprocess.run([sys.executable, child, "triton-cpu"], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert compile_triton(tmp_path / "build")["compiled"] == 1
    assert _cli("bundle", "create", str(tmp_path / "t.kcb"), "--cache-dir", str(tmp_path / "build")).returncode == 0
    served = compile_triton(tmp_path / "node", KERNELCACHE_BUNDLES=str(tmp_path / "t.kcb"))
    assert served["compiled"] == 0
    with kernelcache.FileStreamProgramCache(tmp_path / "node") as node:
        assert len(node) == 0  # served from the bundle, nothing copied into the node's cache
    assert not (tmp_path / "triton-own").exists() or not os.listdir(tmp_path / "triton-own")


def test_create_refuses_a_directory_that_is_not_a_cache_root(tmp_path):
    plain = tmp_path / "photos"
    plain.mkdir()
    (plain / "holiday.jpg").write_bytes(b"\xff\xd8 not a cache")
    proc = _cli("bundle", "create", str(tmp_path / "b.kcb"), "--cache-dir", str(plain))
    assert proc.returncode == 2 and "not a kernelcache cache root" in proc.stderr
    assert sorted(p.name for p in plain.iterdir()) == ["holiday.jpg"] and not (tmp_path / "b.kcb").exists()
