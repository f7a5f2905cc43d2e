"""The on-disk format: one naming rule for every key, and a check that covers the metadata.

Wrong-kernel #3 and #4 (one format change: layout v2). Real NVRTC compiles, real files,
real redis-server; tampering is done to the files, as a bit flip on a disk would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, SUPPORT, run_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import kc

from kernelcache import (
    CompileInfo,
    FileStreamProgramCache,
    InMemoryProgramCache,
    KernelCacheWarning,
    ProgramCacheResource,
    TieredProgramCache,
    compile_program,
)
from kernelcache.stores.file.store import FORMAT_DIR

HERE = os.path.dirname(os.path.abspath(__file__))
CLI_TESTS = os.path.join(os.path.dirname(HERE), "cli")

AXPY = "template <typename T> __global__ void axpy(T a, T* x) { x[threadIdx.x] *= a; }"
EXPRS = ("axpy<float>", "axpy<double>")


def _files(root: str, suffix: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(suffix))


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _compile_axpy(root: str) -> tuple[CompileInfo, dict]:
    info = CompileInfo()
    obj = compile_program(
        AXPY, options=ProgramOptions(arch=ARCH), name_expressions=EXPRS, cache=FileStreamProgramCache(root), info=info
    )
    return info, dict(obj.symbol_mapping)


def _axpy_sidecar(root: str) -> str:
    (sidecar,) = [p for p in _files(os.path.join(root, FORMAT_DIR), ".meta") if b"axpy<float>" in _bytes(p)]
    return sidecar


# -- #4: two distinct keys never share an entry ----------------------------------------------


def _stores(tmp_path, request: pytest.FixtureRequest) -> list[ProgramCacheResource]:
    stores: list[ProgramCacheResource] = [
        InMemoryProgramCache(),
        FileStreamProgramCache(tmp_path / "file"),
        TieredProgramCache([InMemoryProgramCache(), FileStreamProgramCache(tmp_path / "tier")]),
    ]
    bucket = request.getfixturevalue("object_bucket")
    if bucket is not None:
        from kernelcache import ObjectStoreProgramCache

        stores.append(ObjectStoreProgramCache(f"s3://{bucket}/fmt-{os.getpid()}-{id(tmp_path)}"))
    server = request.getfixturevalue("redis_url")
    if server is not None:
        from kernelcache import RedisProgramCache

        stores.append(RedisProgramCache(server, namespace=f"fmt{os.getpid()}-{id(tmp_path)}"))
        stores.append(TieredProgramCache([FileStreamProgramCache(tmp_path / "t2"), RedisProgramCache(server)]))
    return stores


@pytest.fixture(scope="module")
def object_bucket():
    """A bucket on a real S3-protocol server (moto's) on loopback; None where moto or obstore is missing."""
    try:
        import moto.server  # noqa: F401
        import obstore  # noqa: F401
        from object_servers import S3Server, env_for
    except ImportError:
        yield None
        return
    server = S3Server()
    saved = {name: os.environ.get(name) for name in env_for(server.endpoint)}
    os.environ.update(env_for(server.endpoint))
    yield server.bucket()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    server.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    try:
        import redis  # noqa: F401
        from redis_servers import RedisServer
    except ImportError:
        yield None
        return
    if shutil.which("redis-server") is None:
        yield None
        return
    server = RedisServer(str(tmp_path_factory.mktemp("redis")))
    yield server.url
    server.stop()


def test_a_key_and_its_sha256_are_two_entries(tmp_path, request) -> None:
    key = b"k" * 40  # not 32 bytes: named by its SHA-256 in layout v1
    alias = hashlib.sha256(key).digest()
    key32 = bytes(range(32))  # 32 bytes: named by its own hex in layout v1
    stores = _stores(tmp_path, request)
    # Redis and the object store included where they run
    assert len(stores) == 6 or shutil.which("redis-server") is None or request.getfixturevalue("object_bucket") is None
    for store in stores:
        with store:
            store[key] = b"A"
            store[alias] = b"B"
            store[key32] = b"C"
            store[key32.hex()] = b"D"
            assert store.get(key) == b"A", type(store).__name__
            assert store.get(alias) == b"B", type(store).__name__
            assert store.get(key32) == b"C", type(store).__name__


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    a=st.binary(min_size=0, max_size=80),
    b=st.binary(min_size=0, max_size=80),
    derive=st.sampled_from(["none", "sha256", "hex"]),
)
def test_every_pair_of_distinct_keys_keeps_its_own_value(tmp_path, request, a: bytes, b: bytes, derive: str) -> None:
    # The dangerous pairs are the ones a naming rule could conflate: a key and its own
    # digest, a key and its hex spelled as a str key; hypothesis also tries arbitrary pairs.
    if derive == "sha256":
        b = hashlib.sha256(a).digest()
    elif derive == "hex":
        b = a.hex().encode()
    if a == b:
        return
    for store in _stores(tmp_path, request):
        with store:
            store[a] = b"value-of-a"
            store[b] = b"value-of-b"
            assert store.get(a) == b"value-of-a", (type(store).__name__, a, b)
            assert store.get(b) == b"value-of-b", (type(store).__name__, a, b)
            store.clear()


# -- #3: the metadata is covered by the check ------------------------------------------------


def test_a_bit_flip_in_the_symbol_mapping_is_a_miss(tmp_path) -> None:
    root = str(tmp_path)
    first, truth = _compile_axpy(root)
    assert not first.hit
    sidecar = _axpy_sidecar(root)
    raw = _bytes(sidecar)
    # axpy<float> is _Z4axpyIfEvT_PS0_, axpy<double> _Z4axpyIdEvT_PS0_: 'f' and 'd' differ
    # in one bit. Flip it in the float entry of the mapping: a real one-bit corruption.
    mangled_float = truth["axpy<float>"]
    mangled_float = mangled_float.encode() if isinstance(mangled_float, str) else mangled_float
    assert raw.count(mangled_float) == 1
    at = raw.index(mangled_float) + mangled_float.index(b"IfE") + 1
    flipped = raw[:at] + bytes([raw[at] ^ 0x02]) + raw[at + 1 :]
    with open(sidecar, "r+b") as f:
        f.write(flipped)
    # A fresh process (no per-process memo): the damaged record must not be served.
    out = run_python(
        "import json, sys, warnings\n"
        "from test_stores_format import _compile_axpy\n"
        "warnings.simplefilter('ignore')\n"
        "info, mapping = _compile_axpy(sys.argv[1])\n"
        "print(json.dumps([info.hit, {k: (v.decode() if isinstance(v, bytes) else v) for k, v in mapping.items()}]))\n",
        root,
        # The child imports this module, which imports test_cli: both folders, beside tests/support.
        env={"PYTHONPATH": os.pathsep.join([SUPPORT, HERE, CLI_TESTS, os.environ.get("PYTHONPATH", "")])},
    )
    hit, mapping = json.loads(out.strip().splitlines()[-1])
    as_text = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in truth.items()}
    assert mapping == as_text, "a wrong kernel name came out of the cache"
    assert hit is False


def test_a_truncated_sidecar_is_a_miss_with_one_warning(tmp_path) -> None:
    root = str(tmp_path)
    _, truth = _compile_axpy(root)
    sidecar = _axpy_sidecar(root)
    raw = _bytes(sidecar)
    with open(sidecar, "wb") as f:
        f.write(raw[: raw.index(b"\n") + 20])  # header intact, JSON cut short
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info, mapping = _compile_axpy(root)
    assert info.hit is False and mapping == truth
    assert len([w for w in caught if issubclass(w.category, KernelCacheWarning)]) == 1
    again, mapping = _compile_axpy(root)  # the recompile was stored again: a hit, whole
    assert again.hit is True and mapping == truth


def test_verify_reports_a_tampered_sidecar_and_fix_removes_it(tmp_path) -> None:
    root = str(tmp_path)
    _compile_axpy(root)
    sidecar = _axpy_sidecar(root)
    raw = _bytes(sidecar)
    at = raw.index(b'"log"')
    with open(sidecar, "r+b") as f:
        f.seek(at + 1)
        f.write(b"L")  # "Log": one byte of metadata changed, the artifact untouched
    # Older than the scan: verify judges a file written just before it as possibly in flight.
    old = time.time() - 60
    os.utime(sidecar, (old, old))
    report = json.loads(kc("verify", "--json", cache=root, check=False).stdout)
    name = os.path.basename(sidecar)[: -len(".meta")]
    assert report["corrupt"] == [name]
    assert report["remaining"] == 1
    fixed = kc("verify", "--fix", cache=root, check=False)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert not os.path.exists(sidecar) and not os.path.exists(sidecar[: -len(".meta")])
    assert json.loads(kc("verify", "--json", cache=root).stdout)["remaining"] == 0


def test_verify_fix_reports_and_keeps_sidecars_of_another_format(tmp_path) -> None:
    # A team cache shared by two versions: the newer one's entries (a sidecar format this
    # version does not know) are skipped by the read path, and must be kept by its tools.
    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        cache[b"newer"] = b"newer version's artifact"
        cache[b"ours"] = b"this version's artifact"
    newer = [p for p in _files(root, ".meta") if _bytes(p[: -len(".meta")]) == b"newer version's artifact"][0]
    future = b"kernelcache-sidecar 3 00000000 a future header\n{}"
    with open(newer, "wb") as f:
        f.write(future)
    lone = os.path.join(root, FORMAT_DIR, "entries", "ff", "f" * 64 + ".meta")  # the newer version's, no entry
    os.makedirs(os.path.dirname(lone), mode=0o700, exist_ok=True)
    with open(lone, "wb") as f:
        f.write(future)
    old = time.time() - 60
    for p in (newer, lone, newer[: -len(".meta")]):
        os.utime(p, (old, old))
    name = os.path.basename(newer)[: -len(".meta")]
    fixed = kc("verify", "--fix", "--json", cache=root, check=False)
    assert os.path.exists(newer) and os.path.exists(lone) and os.path.exists(newer[: -len(".meta")])
    assert _bytes(newer) == future and _bytes(lone) == future
    assert _bytes(newer[: -len(".meta")]) == b"newer version's artifact"
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    for report in (json.loads(fixed.stdout), json.loads(kc("verify", "--json", cache=root).stdout)):
        assert report["other_format"] == sorted([name, "f" * 64]) and report["corrupt"] == []
        assert report["orphaned_sidecars"] == [] and report["remaining"] == 0
    with FileStreamProgramCache(root) as cache:
        assert cache.get(b"newer") is None and cache[b"ours"] == b"this version's artifact"


# -- the layout bump -------------------------------------------------------------------------


def test_entries_of_the_old_layout_are_a_miss_and_clear_removes_them(tmp_path) -> None:
    assert FORMAT_DIR == "v2"
    root = tmp_path / "c"
    old = root / "v1" / "entries" / "ab"
    old.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    key = bytes(range(32))
    # A v1 entry for this key as v1 named and wrote it; it must not be served by v2.
    (old / key.hex()).write_bytes(b"old bytes")
    (old / (key.hex() + ".meta")).write_bytes(b"kernelcache-sidecar 1 9 0 0 0\n{}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an old tree is not an error, nor a warning
        cache = FileStreamProgramCache(root)
        assert cache.get(key) is None
        cache[key] = b"new"
        assert cache[key] == b"new"
    assert (root / "v1").exists()  # a reader never deletes what it cannot verify
    kc("clear", "--yes", cache=str(root))
    assert not (root / "v1").exists() and (root / "v2").exists()
    (root / "v1" / "entries").mkdir(parents=True)
    kc("prune", "--older-than", "30d", cache=str(root))
    assert not (root / "v1").exists()


def test_tools_print_and_accept_the_entry_name(tmp_path) -> None:
    from kernelcache.stores.naming import entry_name

    root = str(tmp_path)
    info, _ = _compile_axpy(root)
    name = entry_name(info.key)
    assert os.path.exists(os.path.join(root, FORMAT_DIR, "entries", name[:2], name))
    ls_text = kc("ls", cache=root).stdout
    printed = next(tok for tok in ls_text.split() if name.startswith(tok) and len(tok) >= 8)  # the key column
    assert info.key.hex()[:8] not in ls_text
    assert json.loads(kc("show", printed, "--json", cache=root).stdout)["key"] == name  # accepted as printed
    (row,) = json.loads(kc("ls", "--json", cache=root).stdout)
    assert row["key"] == name
    shown = json.loads(kc("show", name[:16], "--json", cache=root).stdout)
    assert shown["key"] == name and shown["meta"]["kernels"] == list(EXPRS)
    kc("export", name[:16], "-o", str(tmp_path / "out.cubin"), cache=root)
    assert (tmp_path / "out.cubin").read_bytes()[:4] == b"\x7fELF"


def test_warm_ls_explain_show_agree_on_the_entry_name(tmp_path) -> None:
    from test_cli import EXAMPLE

    root = str(tmp_path / "c")
    warmed = json.loads(kc("warm", EXAMPLE, "--json", cache=root).stdout)
    listed = {r["key"] for r in json.loads(kc("ls", "--json", cache=root).stdout)}
    assert {r["key"] for r in warmed} == listed
    explained = json.loads(kc("explain", EXAMPLE, "--entry", "saxpy", "--json", cache=root).stdout)
    assert explained["in_cache"] is True and explained["key"] in listed
    text = kc("explain", EXAMPLE, "--entry", "saxpy", cache=root).stdout
    prefix = text.split()[1].rstrip(":")
    assert explained["key"].startswith(prefix)
    assert json.loads(kc("show", prefix, "--json", cache=root).stdout)["key"] == explained["key"]
