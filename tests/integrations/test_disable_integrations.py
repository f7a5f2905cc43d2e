"""KERNELCACHE_DISABLE=1 reaches the integrations: Triton's manager becomes Triton's own
FileCacheManager, the Triton remote backend and CuPy's backend are empty caches that store
nothing; kernelcache's directory is never created. Through the real entry points: Triton's
get_cache_manager with TRITON_CACHE_MANAGER set, CuPy's backend hook."""

from __future__ import annotations

import hashlib

import pytest
from helpers import run_python

MANAGER = "kernelcache.triton:KernelCacheManager"


def _key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def disabled(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELCACHE_DISABLE", "1")
    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-own"))
    return tmp_path


def test_disabled_triton_manager_is_tritons_file_manager(disabled, monkeypatch):
    triton_cache = pytest.importorskip("triton.runtime.cache")
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    own = str(disabled / "triton-own")
    manager = triton_cache.get_cache_manager(_key("disabled"))
    path = manager.put(b"\x7fELF cubin", "kern.cubin")
    assert path.startswith(own), path  # before: a copy under kernelcache's root
    assert manager.get_file("kern.cubin") == path
    group = manager.put_group("kern.json", {"kern.cubin": path})
    assert group is not None and group.startswith(own)
    again = triton_cache.get_cache_manager(_key("disabled"))
    assert again.get_group("kern.json") == {"kern.cubin": path}
    assert not (disabled / "kc").exists()  # kernelcache's store was neither read nor written


def test_disabled_triton_remote_backend_stores_nothing(disabled, monkeypatch):
    triton_cache = pytest.importorskip("triton.runtime.cache")
    monkeypatch.setenv("TRITON_CACHE_MANAGER", "triton.runtime.cache:RemoteCacheManager")
    monkeypatch.setenv("TRITON_REMOTE_CACHE_BACKEND", "kernelcache.triton:KernelCacheRemoteBackend")
    writer = triton_cache.get_cache_manager(_key("remote-disabled"))
    writer.put(b"\x7fELF cubin", "kern.cubin")
    reader = triton_cache.get_cache_manager(_key("remote-disabled"))  # a fresh backend
    assert reader.get_file("kern.cubin") is None  # before: the file came back from kernelcache
    assert not (disabled / "kc").exists()
    monkeypatch.delenv("KERNELCACHE_DISABLE")
    enabled = triton_cache.get_cache_manager(_key("remote-disabled"))
    assert enabled.get_file("kern.cubin") is None  # nothing was stored while disabled


def test_disabled_cupy_backend_is_an_empty_cache(tmp_path):
    pytest.importorskip("cupy.cuda._compiler_cache")  # CuPy >= 14
    code = (
        "import os\n"
        "import kernelcache.cupy as k\n"
        "from cupy.cuda import compiler\n"
        "k.install_backend()\n"
        "b = compiler._kernel_cache_backend\n"
        "b.save('abc.cubin', b'payload', 'src')\n"
        "print(b.load('abc.cubin'), os.path.exists(os.environ['KERNELCACHE_DIR']))\n"
        "del os.environ['KERNELCACHE_DISABLE']\n"
        "print(b.load('abc.cubin'))\n"  # nothing was stored while disabled
    )
    env = {"KERNELCACHE_DIR": str(tmp_path / "kc"), "KERNELCACHE_DISABLE": "1"}
    assert run_python(code, env=env).split() == ["None", "False", "None"]  # before: b'payload' True ...
