"""Disk use per Triton kernel through kernelcache is no more than Triton's own directory's,
for the same calls (tests/support/_triton_disk_child.py makes the calls Triton makes to compile and
then load kernels, in fresh processes). Exact counts, each inode once, as ``du`` counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from _triton_disk_child import usage  # noqa: E402
from helpers import support_script

CHILD = support_script("_triton_disk_child.py")
MORE = 4  # kernels measured after the first one (which also makes each cache's own tree)


def _env(root, ours: bool, binary_only: str | None) -> dict[str, str]:
    env = dict(os.environ, KERNELCACHE_DIR=str(root / "kc"), TRITON_CACHE_DIR=str(root / "triton"))
    env.pop("TRITON_CACHE_MANAGER", None)
    env.pop("TRITON_STORE_BINARY_ONLY", None)
    if ours:
        env["TRITON_CACHE_MANAGER"] = "kernelcache.triton:KernelCacheManager"
    if binary_only is not None:
        env["TRITON_STORE_BINARY_ONLY"] = binary_only
    return env


def _calls(env: dict[str, str], first: int, count: int) -> dict:
    out = subprocess.run(
        [sys.executable, CHILD, "calls", str(first), str(count)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _added_by_more_kernels(root, ours: bool, binary_only: str | None) -> dict[str, int]:
    """What MORE kernels (compiled in one process, loaded in the next) add to a cache that
    already holds one kernel."""
    env = _env(root, ours, binary_only)
    assert _calls(env, 0, 1)["compiled"] == 1
    assert _calls(env, 0, 1)["hits"] == 1
    before = usage(str(root))
    assert _calls(env, 1, MORE) == {"compiled": MORE, "hits": 0}
    assert _calls(env, 1, MORE) == {"compiled": 0, "hits": MORE}  # the warm process compiles nothing
    after = usage(str(root))
    return {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("binary_only", [None, "1", "0"], ids=["default", "binary-only", "all-irs"])
def test_disk_per_kernel_is_at_most_tritons_own(tmp_path, binary_only):
    ours = _added_by_more_kernels(tmp_path / "ours", True, binary_only)
    theirs = _added_by_more_kernels(tmp_path / "theirs", False, binary_only)
    assert ours["inodes"] <= theirs["inodes"], (ours, theirs)
    assert ours["bytes"] <= theirs["bytes"], (ours, theirs)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _previous_layout(store, key: str, members: dict[str, bytes], single: tuple[str, bytes]) -> dict[str, bytes]:
    """Write a group and a single file exactly as the previous layout did (a manifest entry of
    member digests, each member an entry of its own); return their keys by role."""
    import hashlib

    import triton

    prefix = key.encode() + b"\x00"

    def file_key(name: str) -> bytes:
        return b"kernelcache.triton.file/1\x00" + prefix + name.encode()

    def meta(name: str) -> dict:
        ext = name.rsplit(".", 1)[-1]
        return {"kind": "triton", "code_type": "triton", "target_type": ext, "kernels": [name], "triton_key": key}

    for name, data in [*members.items(), single]:
        store.set_record(file_key(name), data, {**meta(name), "triton_version": triton.__version__})
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    manifest = json.dumps({"format": 1, "members": digests}, sort_keys=True).encode()
    group_key = b"kernelcache.triton.group/1\x00" + prefix + b"kern.json"
    group_meta = {
        "kind": "triton-group",
        "code_type": "triton",
        "target_type": "group",
        "kernels": ["kern"],
        "members": {name: len(data) for name, data in sorted(members.items())},
        "group_bytes": sum(len(data) for data in members.values()),
        "options": {"arch": "sm_90"},
        "triton_key": key,
        "triton_version": triton.__version__,
    }
    store.set_record(group_key, manifest, group_meta)
    return {"group": group_key, "single": file_key(single[0])}


def test_a_cache_of_the_previous_layout_misses_its_groups_cleanly_and_serves_its_files(tmp_path, monkeypatch):
    import hashlib
    import warnings

    from triton.runtime.cache import get_cache_manager

    from kernelcache.log import KernelCacheWarning
    from kernelcache.stores.file.store import FileStreamProgramCache

    root = tmp_path / "kc"
    key = hashlib.sha256(b"previous layout").hexdigest()
    members = {"kern.cubin": b"old cubin", "kern.json": b'{"name": "kern"}'}
    launcher = ("__triton_launcher.cpython-311-x86_64-linux-gnu.so", b"\x7fELF old launcher")
    monkeypatch.setenv("KERNELCACHE_DIR", str(root))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "kernelcache.triton:KernelCacheManager")
    with FileStreamProgramCache(str(root)) as store:
        old = _previous_layout(store, get_cache_manager(key).key, members, launcher)  # the key Triton hands it
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelCacheWarning)  # a clean miss: no warning, no error
        manager = get_cache_manager(key)
        assert manager.get_group("kern.json") is None  # Triton compiles and stores it again
        with open(manager.get_file(launcher[0]), "rb") as f:
            assert f.read() == launcher[1]  # the previous layout's launcher needs no rebuild
        new = {"kern.cubin": b"new cubin", "kern.json": b'{"name": "kern"}'}
        paths = {name: manager.put(data, name) for name, data in new.items()}
        manager.put_group("kern.json", paths)
        got = get_cache_manager(key).get_group("kern.json")
        assert got is not None and {n: _read(p) for n, p in got.items()} == new
    # The previous layout's entries stay, for a process of that version sharing the cache.
    with FileStreamProgramCache(str(root)) as store:
        assert store.get_record(old["group"]) is not None and store.get_record(old["single"]) is not None
