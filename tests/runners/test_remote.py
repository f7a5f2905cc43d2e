"""warm on an executor: a real Dask LocalCluster of two worker processes on 127.0.0.1 (started once
for the module), a real ProcessPoolExecutor, real compiles, a real bundle and a strict run of it.
The keys and bytes are a local warm's; each kernel x arch compiles exactly once, in a worker; a
worker that compiled with another NVRTC build is refused and counted; a wrong --executor is an
error before anything compiles."""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from concurrent.futures import ProcessPoolExecutor

import pytest
from helpers import settle_timestamps

import kernelcache
from kernelcache import FileStreamProgramCache
from kernelcache.runners.remote import compiled_here

distributed = pytest.importorskip("distributed")

ARCHS = ("sm_80", "sm_90")
K = 3  # kernels in the lockfile; one reads a header through its working directory


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each; they run this interpreter with its PYTHONPATH."""
    with (
        distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        ) as c,
        distributed.Client(c) as client,
    ):
        yield c, client


@pytest.fixture
def lockfile(tmp_path) -> str:
    """A KERNELCACHE_RECORD-style lockfile of K kernels recorded in ``proj`` (one includes
    "scale.h" from there: its header trace travels back from the worker)."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "scale.h").write_text("#define SCALE 3.0f\n")
    settle_timestamps()
    path = tmp_path / "kernels.lock"
    with open(path, "w") as f:
        for i in range(K):
            head = '#include "scale.h"\n' if i == 0 else "#define SCALE 1.0f\n"
            code = head + f'extern "C" __global__ void k{i}(float* a) {{ a[threadIdx.x] *= SCALE + {i}; }}\n'
            kernel = {"name": f"k{i}", "code": code, "code_type": "c++", "target": "cubin", "arch": "sm_90"}
            f.write(json.dumps({"kernel": [{**kernel, "options": {}, "cwd": str(proj)}]}) + "\n")
    return str(path)


def _artifacts(root: str, results: list[dict]) -> dict[str, bytes]:
    """Every warmed kernel's stored artifact, by its entry name."""
    out = {}
    for r in results:
        assert not r.get("error"), r
        with open(os.path.join(root, "v2", "entries", r["key"][:2], r["key"]), "rb") as f:
            out[r["key"]] = f.read()
    return out


def _worker_compiles(client) -> int:
    return sum(sum(counts.values()) for counts in client.run(compiled_here).values())


def test_warm_on_a_dask_cluster_stores_a_local_warms_keys_and_bytes_compiling_each_once(
    cluster, lockfile, tmp_path
) -> None:
    _, client = cluster
    local_dir, remote_dir = str(tmp_path / "local"), str(tmp_path / "remote")
    local = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=local_dir)
    before = _worker_compiles(client)
    remote = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=remote_dir, executor=client.get_executor())
    assert len(remote) == K * len(ARCHS)
    assert _artifacts(remote_dir, remote) == _artifacts(local_dir, local)
    # Exactly K x archs compiles, each in a worker process of the cluster; none in this one.
    assert _worker_compiles(client) - before == K * len(ARCHS)
    assert FileStreamProgramCache(remote_dir).stats()["compiles"] == K * len(ARCHS)
    # A second warm on the cluster finds every kernel stored: no task is sent.
    again = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=remote_dir, executor=client.get_executor())
    assert all(r["hit"] for r in again)
    assert _worker_compiles(client) - before == K * len(ARCHS)


STRICT_RUN = textwrap.dedent(
    """
    import json, os, sys
    from kernelcache import CompileInfo, compile_program
    from kernelcache.compile.lockfile import request_of
    hits = 0
    for line in open(sys.argv[1]):
        kernel = json.loads(line)["kernel"][0]
        for arch in sys.argv[2:]:
            os.chdir(kernel["cwd"])
            r, info = request_of(kernel, arch), CompileInfo()
            compile_program(r.code, r.code_type, r.target_type, options=r.options, info=info)
            hits += info.hit
    print(hits)
    """
)


def test_the_cli_on_the_clusters_scheduler_makes_a_bundle_a_strict_run_hits_entirely(
    cluster, lockfile, tmp_path
) -> None:
    c, client = cluster
    address = c.scheduler_address.removeprefix("tcp://")
    bundle, cache = str(tmp_path / "kc.kcb"), str(tmp_path / "cache")
    before = _worker_compiles(client)
    args = ["warm", lockfile, "--executor", f"dask://{address}", "--bundle", bundle, "--cache-dir", cache, "--json"]
    args += [a for arch in ARCHS for a in ("--arch", arch)]
    proc = subprocess.run([sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(json.loads(proc.stdout)["kernels"]) == K * len(ARCHS)
    assert _worker_compiles(client) - before == K * len(ARCHS)
    # A new node: an empty cache directory, the bundle read-only, every miss an error.
    env = {
        **os.environ,
        "KERNELCACHE_DIR": str(tmp_path / "empty"),
        "KERNELCACHE_BUNDLES": bundle,
        "KERNELCACHE_REQUIRE_HIT": "1",
        "KERNELCACHE_RECORD": "",
    }
    strict = subprocess.run(
        [sys.executable, "-c", STRICT_RUN, lockfile, *ARCHS], capture_output=True, text=True, env=env, timeout=300
    )
    assert strict.returncode == 0, strict.stderr[-3000:]
    assert int(strict.stdout) == K * len(ARCHS)


def test_a_process_pool_through_the_python_call_gives_a_local_warms_bytes(lockfile, tmp_path) -> None:
    local_dir, pool_dir = str(tmp_path / "local"), str(tmp_path / "pool")
    local = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=local_dir)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        warmed = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=pool_dir, executor=pool)
        assert pool.submit(compiled_here).result() == {"ok": K * len(ARCHS)}  # all in the pool's process
    assert _artifacts(pool_dir, warmed) == _artifacts(local_dir, local)


def _another_nvrtc_build(where) -> str:
    """A copy of this process's libnvrtc whose ELF build id differs: a real library that loads and
    compiles, with the identity of another build (what keys.toolchain records of it)."""
    from kernelcache.keys.toolchain import library_file

    path = library_file("nvrtc", load=True)[0]
    where.mkdir()
    for name in os.listdir(os.path.dirname(path)):  # its builtins beside it, as the wheel has them
        if name.startswith("libnvrtc"):
            shutil.copy(os.path.join(os.path.dirname(path), name), where / name)
    copy = where / os.path.basename(path)
    data = bytearray(copy.read_bytes())
    note = data.find(struct.pack("<III", 4, 20, 3) + b"GNU\0")  # NT_GNU_BUILD_ID; its 20 bytes follow
    assert note > 0
    at = note + 16
    data[at : at + 20] = bytes(b ^ 0xFF for b in data[at : at + 20])
    copy.write_bytes(bytes(data))
    return str(copy)


def test_a_worker_that_compiled_with_another_nvrtc_build_is_refused_and_counted(lockfile, tmp_path) -> None:
    other = _another_nvrtc_build(tmp_path / "other")
    cache = str(tmp_path / "cache")
    # The worker loads the other build before cuda.bindings looks for one (cuda.pathfinder then
    # takes the library already loaded), as a worker in another environment would have it.
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn, initializer=ctypes.CDLL, initargs=(other, os.RTLD_GLOBAL)) as pool:
        with pytest.warns(kernelcache.KernelCacheWarning, match="compiled with"):
            results = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=cache, executor=pool)
        assert pool.submit(compiled_here).result() == {"ok": K * len(ARCHS)}  # it did compile them
    assert all("ForeignWorker" in r["error"] and "refused" in r["error"] for r in results), results
    stats = FileStreamProgramCache(cache).stats()
    assert stats["stores"] == 0 and stats["compiles"] == 0  # nothing stored under the caller's keys
    assert stats["errors_by_cause"] == {"not_stored": K * len(ARCHS)}


@pytest.mark.parametrize("spec", ["ray://x", "dask://nohostport", "tcp://127.0.0.1:8786", "dask://127.0.0.1:x"])
def test_a_wrong_executor_is_an_error_before_anything_compiles(lockfile, tmp_path, spec) -> None:
    cache = str(tmp_path / "cache")
    args = [sys.executable, "-m", "kernelcache", "warm", lockfile, "--executor", spec, "--cache-dir", cache]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "dask://HOST:PORT" in proc.stderr, proc.stderr
    assert not os.path.exists(cache)  # nothing compiled, nothing opened


def test_without_dask_installed_the_error_names_the_extra(lockfile, tmp_path) -> None:
    # sys.modules["distributed"] = None: the import fails as it does where the package is absent.
    code = "import sys; sys.modules['distributed'] = None; from kernelcache.cli.main import main; main()"
    cache = str(tmp_path / "cache")
    args = ["warm", lockfile, "--executor", "dask://127.0.0.1:8786", "--cache-dir", cache]
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "pip install 'kernelcache[dask]'" in proc.stderr, proc.stderr
    assert not os.path.exists(cache)


def test_a_worker_that_read_another_header_at_the_same_path_is_refused(lockfile, tmp_path) -> None:
    """A worker whose "scale.h" (the path the caller's compile reads) holds other content compiles
    other bytes: its result must not be stored under the key of the caller's header."""
    from mountns import can_unshare, see_file_as

    if not can_unshare():
        pytest.skip("mount namespaces need root here")
    header, other = tmp_path / "proj" / "scale.h", tmp_path / "other.h"
    other.write_text("#define SCALE 7.0f\n")
    cache = str(tmp_path / "cache")
    spawn = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(1, mp_context=spawn, initializer=see_file_as, initargs=(str(header), str(other)))
    with pool, pytest.warns(kernelcache.KernelCacheWarning, match="other content"):
        results = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=cache, executor=pool)
    refused = [r for r in results if r.get("error")]
    assert [r["name"] for r in refused] == ["k0", "k0"], results  # the kernel that includes it, each arch
    assert all("ForeignWorker" in r["error"] and str(header) in r["error"] for r in refused)
    assert FileStreamProgramCache(cache).stats()["errors_by_cause"] == {"not_stored": len(ARCHS)}
    # The others were stored; the caller's own warm of the header's kernel stores it, and the same bytes.
    again = kernelcache.warm(lockfile, archs=ARCHS, cache_dir=cache)
    assert sum(not r["hit"] for r in again) == len(ARCHS) and not any(r.get("error") for r in again)


def test_restrict_kernels_never_go_to_a_shared_worker(tmp_path) -> None:
    """NVRTC keeps --restrict on for the rest of a process that ran one: a restrict=True kernel is
    compiled on this host (in a process of its own), the others in the pool, and all are stored."""
    path = tmp_path / "kernels.lock"
    with open(path, "w") as f:
        for i, options in enumerate(({"restrict": True}, {})):
            code = f'extern "C" __global__ void r{i}(float* a, const float* b) {{ a[threadIdx.x] = b[0] + {i}; }}\n'
            kernel = {"name": f"r{i}", "code": code, "code_type": "c++", "target": "cubin", "arch": "sm_90"}
            f.write(json.dumps({"kernel": [{**kernel, "options": options, "cwd": str(tmp_path)}]}) + "\n")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = kernelcache.warm(str(path), archs=ARCHS, cache_dir=str(tmp_path / "cache"), executor=pool)
        assert pool.submit(compiled_here).result() == {"ok": len(ARCHS)}  # r1 only
    assert not any(r.get("error") for r in results) and len(results) == 2 * len(ARCHS)


FORK_CHILD = textwrap.dedent(
    """
    import os, signal, threading
    from cuda.core import ProgramOptions
    from kernelcache.compile.request import CompileRequest
    from kernelcache.runners import compilers, remote
    held, release = threading.Event(), threading.Event()
    def compiling():  # what a worker thread in the middle of a compile holds
        with remote._one_at_a_time:
            held.set()
            release.wait()
    threading.Thread(target=compiling, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        signal.alarm(30)  # a hang ends the child with SIGALRM (a tiny compile takes well under 1 s)
        r = CompileRequest.of('extern "C" __global__ void f() {}', "c++", "cubin", ProgramOptions(arch="sm_90"), ())
        _, _, call = compilers.plan_compile(r, None, direct_ptx=True)
        got = remote.kernelcache_compile("nvrtc", (call, None), os.getcwd(), False, {}, False)
        os._exit(0 if got["reply"][0] == "ok" else 3)
    release.set()
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    """
)


def test_a_process_forked_while_another_thread_compiles_compiles_without_waiting_for_it() -> None:
    out = subprocess.run([sys.executable, "-c", FORK_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "0", out.stdout  # not -14 (SIGALRM: it waited on the parent thread's lock)
