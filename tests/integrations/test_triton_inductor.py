"""Inductor (torch.compile) reads kernels from Triton's own directory by path: kernelcache's
manager leaves a group there for it, as Triton's own manager would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
from triton.runtime.cache import FileCacheManager  # noqa: E402

from kernelcache.triton import mirror_group  # noqa: E402

KEY = "A" * 52  # Triton's keys: base32 of a sha256


def test_a_group_mirrored_is_read_back_by_tritons_own_manager(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    members = {"k.cubin": b"\x7fELF-the-binary", "k.json": b'{"name": "k"}'}
    paths = mirror_group(KEY, "k.json", members)
    assert paths is not None and sorted(paths) == ["k.cubin", "k.json"]
    assert all(os.path.dirname(p) == str(tmp_path / "triton" / KEY) for p in paths.values())
    found = FileCacheManager(KEY).get_group("k.json")  # what Inductor's and Triton's readers see
    assert found is not None and {n: Path(p).read_bytes() for n, p in found.items()} == members
    # Already complete there (Inductor emitted it, or another process mirrored it): used as is.
    before = {p: os.stat(p).st_mtime_ns for p in paths.values()}
    assert mirror_group(KEY, "k.json", members) == paths
    assert {p: os.stat(p).st_mtime_ns for p in paths.values()} == before


def test_a_directory_that_cannot_be_written_leaves_our_copies(tmp_path, monkeypatch):
    (tmp_path / "triton").write_text("a file where Triton's directory must be")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    with pytest.warns(Warning, match="Triton's own directory"):
        assert mirror_group(KEY, "k.json", {"k.cubin": b"x", "k.json": b"{}"}) is None


# A process where Inductor is loaded (torch.compile imported it), without torch installed here:
# the module Inductor's import leaves in sys.modules. Then the worker, as a Triton user.
AS_INDUCTOR = (
    "import runpy, sys, types\n"
    "sys.modules['torch._inductor'] = types.ModuleType('torch._inductor')\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, sys.argv[0].rpartition('/')[0])\n"  # as `python script.py` puts its folder first
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
from helpers import support_script  # noqa: E402

WORKER = support_script("_triton_worker.py")
NAMES = ["kern.cubin", "kern.json"]


def _worker(env: dict[str, str], *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", AS_INDUCTOR, WORKER, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _kc_env(tmp_path, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ, KERNELCACHE_DIR=str(tmp_path / "kc"), TRITON_CACHE_MANAGER="kernelcache.triton:KernelCacheManager"
    )
    env.update(extra)
    return env


@pytest.mark.parametrize("where", ["a file", "empty"])
def test_a_compile_under_inductor_works_where_tritons_directory_cannot_be_written(tmp_path, where):
    # A read-only HOME (Triton's default directory), a file where it must be, or
    # TRITON_CACHE_DIR set but empty (Triton's manager raises RuntimeError): the miss, the
    # compile and the hit all go through kernelcache, as without Inductor.
    (tmp_path / "triton").write_text("a file where Triton's directory must be")
    env = _kc_env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton") if where == "a file" else "")
    cold = _worker(env, "compile")
    warm = _worker(env, "compile")
    assert (cold["compiled"], warm["compiled"], warm["hits"]) == (1, 0, 1)
    assert warm["cubin_sha256"] == cold["cubin_sha256"]


def test_a_group_file_of_tritons_remote_manager_in_its_directory_leaves_our_hit_intact(tmp_path):
    # Triton's RemoteCacheManager (over our remote backend, the other set-up) leaves in
    # Triton's directory a group file whose child_paths is a list of names, which Triton's
    # FileCacheManager cannot read. The same machine then switched to our manager, under
    # Inductor: the group kernelcache holds is a hit, and Triton's directory gets a group
    # its FileCacheManager reads.
    key = "B" * 64  # what Triton passes get_cache_manager (a sha256 hex)
    base = dict(os.environ, KERNELCACHE_DIR=str(tmp_path / "kc"), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    remote = dict(
        base,
        TRITON_CACHE_MANAGER="triton.runtime.cache:RemoteCacheManager",
        TRITON_REMOTE_CACHE_BACKEND="kernelcache.triton:KernelCacheRemoteBackend",
    )
    subprocess.run([sys.executable, WORKER, "put", key, "v1", *NAMES], env=remote, check=True, timeout=120)
    (group_file,) = (tmp_path / "triton").glob("*/__grp__kern.json")
    assert isinstance(json.loads(group_file.read_text())["child_paths"], list)
    got = _worker(_kc_env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton")), "get", key, *NAMES)
    assert got["group"] == {name: f"v1:{name}" for name in NAMES}
    triton_dir = str(tmp_path / "triton")
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from triton.runtime.cache import FileCacheManager as F; print(sorted(F({group_file.parent.name!r}).get_group('kern.json')))",
        ],
        env=dict(os.environ, TRITON_CACHE_DIR=triton_dir),
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == str(NAMES)


def test_a_damaged_or_other_group_in_tritons_directory_is_not_what_a_hit_returns(tmp_path):
    # kernelcache holds the checked group; Triton's directory a complete group by its names,
    # but one byte of its binary flipped (a disk, a killed writer of another version). The
    # paths a hit hands out hold the checked bytes, and Triton's directory is mended.
    env = _kc_env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    key = "C" * 64
    _worker(env, "put", key, "v1", *NAMES)
    (cubin,) = (tmp_path / "triton").glob("*/kern.cubin")
    damaged = bytearray(cubin.read_bytes())
    damaged[0] ^= 0x01
    cubin.write_bytes(bytes(damaged))
    assert _worker(env, "get", key, *NAMES)["group"] == {name: f"v1:{name}" for name in NAMES}
    assert cubin.read_bytes() == b"v1:kern.cubin"


@pytest.mark.parametrize("where", ["kern.cubin", "__grp__kern.json"])
def test_a_fifo_at_a_member_path_in_tritons_directory_never_hangs_a_hit(tmp_path, where):
    # Whoever can write Triton's directory may leave a FIFO where a member goes; the compare
    # with the checked bytes must not wait on it (a plain open would, forever).
    env = _kc_env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    key = "E" * 64
    _worker(env, "put", key, "v1", *NAMES)
    (planted,) = (tmp_path / "triton").glob(f"*/{where}")
    planted.unlink()
    os.mkfifo(planted)
    args = [sys.executable, "-c", AS_INDUCTOR, WORKER, "get", key, *NAMES]
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["group"] == {name: f"v1:{name}" for name in NAMES}
    assert planted.is_file()  # Triton's directory mended: a file again
    if where == "kern.cubin":
        assert planted.read_bytes() == b"v1:kern.cubin"


def test_a_hit_under_inductor_hands_triton_copies_a_peer_in_tritons_directory_cannot_change(tmp_path):
    # Race: a peer writing another version of the key into Triton's own directory (Triton's
    # FileCacheManager replaces the files one by one, by rename) while a process holds the
    # paths of a hit. The paths kernelcache hands Triton are its own copies of the checked
    # bytes: they keep them, whatever happens in Triton's directory meanwhile.
    env = _kc_env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    key = "D" * 64
    _worker(env, "put", key, "v1", *NAMES)
    holder = subprocess.Popen(
        [sys.executable, "-c", AS_INDUCTOR, WORKER, "get-hold", key],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    held = json.loads(holder.stdout.readline())["paths"]
    assert len(held) == len(NAMES)
    own = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    own.pop("TRITON_CACHE_MANAGER", None)  # the peer: Triton's own manager, another version
    subprocess.run([sys.executable, WORKER, "put", key, "v2", *NAMES], env=own, check=True, timeout=120)
    (cubin,) = (tmp_path / "triton").glob("*/kern.cubin")
    assert cubin.read_bytes() == b"v2:kern.cubin"  # the peer did replace Triton's files
    out, _ = holder.communicate("\n", timeout=120)
    assert json.loads(out.strip().splitlines()[-1]) == {"intact": True}


CHILD = r"""
import json, torch
from torch._dynamo.utils import counters

@torch.compile
def f(x, y):
    return torch.nn.functional.gelu(x @ y).softmax(-1) * 2.0

x = torch.randn(64, 64, device="cuda")
out = f(x, x)
torch.cuda.synchronize()
ok = torch.allclose(out, torch.nn.functional.gelu(x @ x).softmax(-1) * 2.0, atol=1e-4)
print(json.dumps({"ok": bool(ok), **{k: v for k, v in counters["inductor"].items() if "triton_bundler" in k}}))
"""


@pytest.mark.gpu
def test_inductor_bundles_and_reloads_kernels_through_our_manager(tmp_path):
    pytest.importorskip("torch")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")

    def run(node: str) -> dict:
        env = {
            **os.environ,
            "TRITON_CACHE_MANAGER": "kernelcache.triton:KernelCacheManager",
            "KERNELCACHE_DIR": str(tmp_path / node / "kc"),
            "TRITON_CACHE_DIR": str(tmp_path / node / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # the FX-graph cache: shared
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_BUNDLE_TRITON_INTO_FX_GRAPH_CACHE": "1",
        }
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run("a")
    assert first["ok"] and first.get("triton_bundler_save_kernel", 0) > 0  # Inductor found our kernels there
    second = run("b")  # another node: empty Triton and kernelcache directories, the FX-graph entry shared
    assert second["ok"] and second.get("triton_bundler_read_and_emit_kernel", 0) > 0
