"""A bundle built from real compiles, on a read-only mount, served to another uid in a fresh process.

Root builds the bundle, bind-mounts its directory read-only and creates a second user; the
child (tests/support/_bundle_child.py) drops to that user before it opens the bundle. Skipped when
not root, without useradd, or where mounting is not allowed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _bundle_child import compile_item
from helpers import support_script
from uids import unique

import kernelcache
from kernelcache.stores.bundle import format as fmt

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to create a real second user",
)

USER = unique("kcbundle_reader")
CHILD = support_script("_bundle_child.py")
SPEC = [
    {"code": 'extern "C" __global__ void one(float* x) { x[0] = 1.0f; }', "arch": "sm_90"},
    {"code": 'extern "C" __global__ void two(float* x) { x[0] = 2.0f; }', "arch": "sm_80"},
    {
        "code": "template <int N> __global__ void scale(float* x) { x[0] *= N; }",
        "arch": "sm_90",
        "names": ["scale<3>"],
    },
]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def reader() -> Iterator[pwd.struct_passwd]:
    subprocess.run(["userdel", USER], capture_output=True)
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", USER], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(USER)
    finally:
        subprocess.run(["userdel", USER], capture_output=True)


@contextlib.contextmanager
def read_only_view(source: Path) -> Iterator[Path]:
    """``source`` bind-mounted read-only at a new path (the same files, no writes possible)."""
    point = source.parent / (source.name + "-ro")
    point.mkdir()
    if subprocess.run(["mount", "--bind", str(source), str(point)], capture_output=True).returncode != 0:
        point.rmdir()
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(point)], check=True, capture_output=True)
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
        point.rmdir()


def _public_dir() -> Path:
    """A new directory under /tmp that every user can enter (pytest's public_tmp is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="kcbundle-", dir="/tmp"))
    os.chmod(path, 0o755)
    return path


@pytest.fixture
def public_tmp() -> Iterator[Path]:
    path = _public_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def built() -> Iterator[dict]:
    """A bundle of real compiles (made by `kernelcache bundle create`) and what each compile gave."""
    root = _public_dir()
    cache = kernelcache.FileStreamProgramCache(root / "cache")
    expected, names = [], []
    for item in SPEC:
        obj, info = compile_item(item, cache)
        assert not info.hit
        expected.append(hashlib.sha256(bytes(obj.code)).hexdigest())
        names.append(info.entry_name)
    shipped = root / "ship"
    shipped.mkdir(mode=0o755)
    proc = _cli("bundle", "create", str(shipped / "base.kcb"), "--cache-dir", str(root / "cache"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["records"] == 2 * len(SPEC) and report["skipped"] == []  # each artifact and its source index
    yield {"dir": shipped, "expected": expected, "names": names}
    shutil.rmtree(root, ignore_errors=True)


def _serve(bundle: Path, user: pwd.struct_passwd, home: Path) -> dict:
    # On a GPU host the child's imports before it drops to ``user`` (every module, CuPy's and
    # torch's integrations among them) make the driver's and CuPy's own caches under $HOME
    # (measured on the H200 host: ~/.nv/ComputeCache, ~/.cupy/kernel_cache): they go beside it.
    others = home.parent / (home.name + "-others")
    env = {
        **os.environ,
        "HOME": str(home),
        "KERNELCACHE_DIR": str(home / "kc"),
        "CUDA_CACHE_PATH": str(others / "nv"),
        "CUPY_CACHE_DIR": str(others / "cupy"),
    }
    args = [sys.executable, CHILD, str(bundle), json.dumps(SPEC), str(user.pw_uid), str(user.pw_gid)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_another_uid_on_a_read_only_mount_gets_every_kernel_from_one_file(built, reader, public_tmp):
    home = public_tmp / "nohome"  # never created: the reader must not make its cache directory
    with read_only_view(built["dir"]) as view:
        got = _serve(view / "base.kcb", reader, home)
    assert got["uid"] == reader.pw_uid
    assert got["hits"] == [True, True, True] and got["compiles"] == 0, got
    assert got["sha256"] == built["expected"]  # byte for byte what the compiles produced
    assert got["symbols"][2] and got["symbols"][2][0][0] == "scale<3>"
    assert got["opened"] == [str(view / "base.kcb")]  # one file, opened once, for every look-up
    assert got["made"] == [] and got["locks"] == [] and got["warnings"] == []
    assert not home.exists()


def _bundle_copy(built, folder, name: str, mode: int):  # noqa: ANN001, ANN202 - fixtures' dict, Path
    """A copy of the built bundle as ``folder/name`` (a new 0755 folder), with file mode ``mode``."""
    folder.mkdir(mode=0o755)
    path = folder / name
    shutil.copy(built["dir"] / "base.kcb", path)
    os.chmod(path, mode)
    return path


def test_a_flipped_byte_is_one_miss_with_one_warning_and_verify_names_it(built, reader, public_tmp):
    path = _bundle_copy(built, public_tmp / "ship", "base.kcb", 0o644)
    damaged = path.parent
    raw = bytearray(path.read_bytes())
    header = fmt.HEADER.unpack_from(raw)
    index_at, count = header[5], header[4]
    victim = bytes.fromhex(built["names"][1])
    for i in range(count):
        name, offset, length = fmt.SLOT.unpack_from(raw, index_at + i * fmt.SLOT.size)
        if name == victim:
            raw[offset + length // 2] ^= 0x01  # inside the artifact's bytes
    path.write_bytes(bytes(raw))
    with read_only_view(damaged) as view:
        got = _serve(view / "base.kcb", reader, public_tmp / "nohome")
        verify = _cli("bundle", "verify", str(view / "base.kcb"), "--json")
    assert got["hits"] == [True, False, True] and got["compiles"] == 1, got
    assert got["sha256"] == built["expected"]  # the miss compiled the same kernel
    assert len(got["warnings"]) == 1 and built["names"][1][:16] in got["warnings"][0], got["warnings"]
    assert verify.returncode == 1
    report = json.loads(verify.stdout)
    assert list(report["damaged"]) == [built["names"][1]] and report["checked"] == 2 * len(SPEC)


def test_a_bundle_others_can_write_is_refused_unless_signed(built, reader, public_tmp):
    plain = _bundle_copy(built, public_tmp / "open", "plain.kcb", 0o666)
    open_dir = plain.parent
    with pytest.raises(kernelcache.UnsafeCacheDirError, match="writable by group or others"):
        kernelcache.BundleProgramCache(plain)
    # Signed (bundle create --secret-env), the same mode is fine with the secret.
    signed = open_dir / "signed.kcb"
    env = {**os.environ, "KC_TEST_SECRET": "s3cret"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernelcache", "bundle", "create", str(signed), "--secret-env", "KC_TEST_SECRET"]
        + ["--cache-dir", str(built["dir"].parent / "cache")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    os.chmod(signed, 0o666)
    with kernelcache.BundleProgramCache(signed, secret="s3cret") as store:
        assert store.signed and len(store) == 2 * len(SPEC)
    with pytest.raises(ValueError, match="signed bundle"):
        kernelcache.BundleProgramCache(signed)
    with pytest.raises(ValueError, match="another secret"):
        kernelcache.BundleProgramCache(signed, secret="other")
    # A bundle that the reader does not own, in the reader's eyes owned by someone else.
    os.chmod(plain, 0o644)
    os.chown(plain, reader.pw_uid, reader.pw_gid)
    with pytest.raises(kernelcache.UnsafeCacheDirError, match=f"owned by uid {reader.pw_uid}"):
        kernelcache.BundleProgramCache(plain)
