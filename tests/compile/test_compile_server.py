"""The compile server (compile/server.py): warm workers handed from one real process to the next,
real kills and stops, a real second uid, directories it must refuse; every failure a fallback."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, in_forked_child
from test_compile import HEAVY, needs_bundled_headers
from test_workers import _kill_when_compiling

from kernelcache import FileStreamProgramCache, compile_many, config
from kernelcache.compile import server_link
from kernelcache.compile.workers import pool

CHILD = r"""
import hashlib, json, os, sys, warnings
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile import server_link
from kernelcache.compile.workers import pool
warnings.simplefilter("always")
root, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = 'extern "C" __global__ void s{i}(float* a) {{ a[threadIdx.x] *= {i}.5f; }}\n'
reqs = [{"code": src.format(i=i), "options": ProgramOptions(arch="%s")} for i in range(first, first + count)]
cache = FileStreamProgramCache(root)
with warnings.catch_warnings(record=True) as caught:
    objs = compile_many(reqs, cache=cache, processes=True, max_workers=2)
print(json.dumps({"adopted": pool().adopted, "compiles": cache.stats()["compiles"], "pids": pool().pids(),
    "sha": [hashlib.sha256(bytes(o.code)).hexdigest() for o in objs], "socket": server_link.socket_path(),
    "warnings": [str(w.message) for w in caught]}))
""" % ARCH  # noqa: UP031 - the kernel source has braces of its own


@pytest.fixture
def server_dir(monkeypatch):
    """A runtime directory of this test's (short: a socket path has ~107 bytes), server use on;
    every server started in it, and its workers, gone at the end. This process (and so every
    server and child it starts) runs on 2 CPUs meanwhile: a server keeps one idle worker per CPU,
    and the tests count on 2 of them whatever the host has (16 on the H200 host)."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(cpus)[:2])
    runtime = tempfile.mkdtemp(prefix="kcs", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER", "1")
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER_IDLE", "60")
    pool().close()  # this process's workers: none from before this test
    yield os.path.join(runtime, "kernelcache")
    pool().close()
    for pid in _servers_in(runtime):
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)  # its idle workers end with it (their pipes hang up)
    os.sched_setaffinity(0, cpus)


def _servers_in(runtime: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if pid.isdigit() and any(b"kernelcache.compile.server" in a for a in argv) and runtime.encode() in b" ".join(argv):
            found.append(int(pid))
    return found


def child(root: str, first: int, count: int, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, root, str(first), str(count)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not so after {timeout} s: {check}")


def serving_here() -> str:
    """Start this test's server as a process does: its first ask starts one and takes nothing
    (it does not wait for it); the socket, once the server listens."""
    assert server_link.adopt_worker() is None
    path = server_link.socket_path()
    wait_for(lambda: server_link.server_status(path))
    return path


def served(run, root: str) -> dict:
    """``run(cache_dir)``'s result in a process that a compile server serves: the first process
    of an environment starts its server and compiles on workers of its own; a later one (with a
    cache dir of its own, so that it has misses) is served."""
    for i in range(3):
        out = run(f"{root}-{i}")
        if out["adopted"]:
            return out
    raise AssertionError("no process got workers from a compile server")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_the_next_process_gets_warm_workers_and_the_same_bytes(tmp_path, server_dir) -> None:
    first = child(str(tmp_path / "a"), 0, 4)  # the first: it starts the server and waits for none of it
    assert first["adopted"] == 0 and first["compiles"] == 4 and not first["warnings"]
    path = first["socket"]
    status = wait_for(lambda: (s := server_link.server_status(path)) and s["idle"] == s["target"] and s)
    second = child(str(tmp_path / "b"), 0, 4)
    assert second["socket"] == path and second["adopted"] == 2 and second["compiles"] == 4
    assert set(second["pids"]) <= set(status["workers"])  # the very processes the server kept warm
    assert server_link.server_status(path)["pid"] == status["pid"]  # one server for both
    # The bytes of an in-process compile, one compile per request.
    alone = compile_many(
        [{"code": f'extern "C" __global__ void s{i}(float* a) {{ a[threadIdx.x] *= {i}.5f; }}\n',
          "options": ProgramOptions(arch=ARCH)} for i in range(4)],
        cache=FileStreamProgramCache(tmp_path / "c"), processes=False,
    )  # fmt: skip
    assert second["sha"] == first["sha"] == [hashlib.sha256(bytes(o.code)).hexdigest() for o in alone]
    # Stopped: it stops listening, and its idle workers end with it.
    assert server_link.stop_server(path)
    wait_for(lambda: not alive(status["pid"]) and not any(alive(p) for p in set(status["workers"]) - set(second["pids"])))
    assert not os.path.exists(path)


def test_unset_means_the_server_where_the_driver_is_and_none_elsewhere(tmp_path, server_dir) -> None:
    # The default, through a real process: on a GPU host its workers come from a server (the next
    # process gets them warm); on a host without the driver no server is started at all.
    env = {k: v for k, v in os.environ.items() if k != "KERNELCACHE_COMPILE_SERVER"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "a"), "0", "2"], capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout.strip().splitlines()[-1])
    driver = os.path.exists("/dev/nvidiactl")
    assert first["adopted"] == 0 and first["compiles"] == 2 and not first["warnings"]
    assert bool(_servers_in(os.environ["XDG_RUNTIME_DIR"])) is driver
    if driver:
        second = served(lambda root: json.loads(subprocess.run(
            [sys.executable, "-c", CHILD, root, "0", "2"], capture_output=True, text=True, env=env,
            timeout=120, check=True).stdout.strip().splitlines()[-1]), str(tmp_path / "b"))  # fmt: skip
        assert second["adopted"] == 2 and second["compiles"] == 2


def test_a_process_that_differs_in_what_a_worker_inherits_gets_its_own_server(tmp_path, server_dir) -> None:
    one = child(str(tmp_path / "a"), 0, 2)
    other = child(str(tmp_path / "b"), 0, 2, CUDA_KERNELCACHE_TEST_VARIABLE="1")  # read at a worker's start
    same = child(str(tmp_path / "c"), 0, 2, UNRELATED_TO_WORKERS="1")  # travels with each compile instead
    assert one["socket"] != other["socket"] and same["socket"] == one["socket"]
    assert sorted(n for n in os.listdir(server_dir) if n.endswith(".sock")) == sorted(
        os.path.basename(s) for s in {one["socket"], other["socket"]}
    )


def test_an_idle_server_exits_with_its_workers(tmp_path, server_dir) -> None:
    first = child(str(tmp_path / "a"), 0, 2, KERNELCACHE_COMPILE_SERVER_IDLE="2")
    status = wait_for(lambda: (s := server_link.server_status(first["socket"])) and s["idle"] == s["target"] and s)
    wait_for(lambda: not alive(status["pid"]), timeout=20)
    wait_for(lambda: not any(alive(p) for p in status["workers"]), timeout=10)
    assert not os.path.exists(first["socket"])
    # The next process starts a new one.
    again = child(str(tmp_path / "b"), 0, 2)
    assert again["adopted"] == 0 and wait_for(lambda: server_link.server_status(again["socket"]))["pid"] != status["pid"]


@pytest.mark.parametrize("how", ["mode", "owner", "symlink"])
def test_a_directory_that_is_not_ours_alone_is_never_used(tmp_path, server_dir, how) -> None:
    if how == "mode":
        os.mkdir(server_dir, 0o755)
        os.chmod(server_dir, 0o755)
    elif how == "owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a directory to another uid")
        os.mkdir(server_dir, 0o700)
        os.chown(server_dir, 4242, 4242)  # a real other uid owns it
    else:
        os.mkdir(tmp_path / "elsewhere", 0o700)
        os.symlink(tmp_path / "elsewhere", server_dir)
    before = os.lstat(server_dir)
    out = child(str(tmp_path / "a"), 0, 2)
    assert out["adopted"] == 0 and out["compiles"] == 2 and out["socket"] is None
    assert [w for w in out["warnings"] if "compile server not used" in w and server_dir in w]
    after = os.lstat(server_dir)  # left as it was: never chmod'ed, chown'ed or removed
    assert (after.st_mode, after.st_uid, after.st_ino) == (before.st_mode, before.st_uid, before.st_ino)
    assert not [n for n in os.listdir(server_dir) if n.endswith(".sock")]


def test_a_server_of_another_uid_is_refused(tmp_path, server_dir) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a listener as another uid")
    # A listener run by uid 4242 at the very socket path the child will use.
    where = "from kernelcache.compile import server_link; print(server_link.socket_path())"
    path = subprocess.run([sys.executable, "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    assert path.startswith(server_dir)
    os.chmod(os.path.dirname(server_dir), 0o711)  # 4242 may pass through, not list
    os.chown(server_dir, 4242, 4242)
    ready_r, ready_w = os.pipe()
    planted = os.fork()
    if planted == 0:  # uid 4242, listening where our server would
        try:
            os.setgid(4242)
            os.setuid(4242)
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(path)
            listener.listen(8)
            os.write(ready_w, b"up")
            while True:
                conn, _ = listener.accept()
                conn.sendall(b'{"worker": false}\n')
        finally:
            os._exit(1)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 2) == b"up"
        os.chown(server_dir, os.geteuid(), os.getegid())
        os.chmod(server_dir, 0o700)
        out = child(str(tmp_path / "a"), 0, 2)
        assert (out["socket"], out["adopted"], out["compiles"]) == (path, 0, 2), out
        assert [w for w in out["warnings"] if "served by uid 4242" in w]
    finally:
        os.kill(planted, signal.SIGKILL)
        os.waitpid(planted, 0)


@needs_bundled_headers
def test_a_handed_over_worker_killed_mid_compile_costs_one_retry(tmp_path, server_dir) -> None:
    small = [{"code": f'extern "C" __global__ void k{i}(float* a) {{ a[0] = {i}; }}\n',
              "options": ProgramOptions(arch=ARCH)} for i in range(2)]  # fmt: skip
    serving_here()
    adopted = pool().adopted
    compile_many(small, cache=FileStreamProgramCache(tmp_path / "s"), processes=True, max_workers=2)
    assert pool().adopted == adopted + 2
    handed = set(pool().pids())
    heavy = {"code": HEAVY, "options": ProgramOptions(arch=ARCH, use_bundled_headers=True, std="c++17")}
    cache = FileStreamProgramCache(tmp_path / "c")
    killed: list[int] = []
    crashes = pool().crashes
    watcher = threading.Thread(target=_kill_when_compiling, args=(set(), 1, killed))
    watcher.start()
    try:
        objs = compile_many([heavy], cache=cache, processes=True, max_workers=1)
    finally:
        watcher.join()
    assert len(killed) == 1 and killed[0] in handed and pool().crashes - crashes == 1
    alone = compile_many([heavy], cache=FileStreamProgramCache(tmp_path / "t"), processes=False)
    assert bytes(objs[0].code) == bytes(alone[0].code) and cache.stats()["compiles"] == 1


def test_a_stopped_server_costs_one_wait_then_workers_start_here(tmp_path, server_dir) -> None:
    first = child(str(tmp_path / "a"), 0, 2)
    status = wait_for(lambda: (s := server_link.server_status(first["socket"])) and s["idle"] == s["target"] and s)
    os.kill(status["pid"], signal.SIGSTOP)  # stuck: accepts (the kernel does) but never answers
    try:
        start = time.monotonic()
        out = child(str(tmp_path / "b"), 10, 4)
        took = time.monotonic() - start
    finally:
        os.kill(status["pid"], signal.SIGCONT)
    assert out["adopted"] == 0 and out["compiles"] == 4 and len(out["pids"]) == 2
    assert len([w for w in out["warnings"] if "compile server not used from now on" in w]) == 1
    assert took < server_link._REPLY_S * 2  # one wait, not one per worker
    assert server_link.server_status(first["socket"])["pid"] == status["pid"]  # and it serves again


def test_processes_sharing_a_dir_and_a_server_compile_each_key_once(tmp_path, server_dir) -> None:
    import multiprocessing as mp

    import _batch_workers as bw

    start_at = time.time() + 4.0
    with mp.get_context("spawn").Pool(3) as workers:
        results = workers.starmap(bw.compile_variants, [(str(tmp_path), ARCH, 8, start_at, True)] * 3)
    assert all(r == results[0] for r in results)
    s = FileStreamProgramCache(str(tmp_path)).stats()
    assert (s["compiles"], s["misses"], s["hits"]) == (8, 8, 16)
    assert [n for n in os.listdir(server_dir) if n.endswith(".sock")]  # they went through a server


def test_a_forked_child_holds_none_of_the_handed_over_workers(tmp_path, server_dir) -> None:
    reqs = [{"code": 'extern "C" __global__ void f(float* a) { a[0] = 1; }\n', "options": ProgramOptions(arch=ARCH)}]
    serving_here()
    adopted = pool().adopted
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "p"), processes=True, max_workers=1)
    assert pool().adopted == adopted + 1
    mine = {os.readlink(f"/proc/self/fd/{end.fileno()}") for w in pool()._all for end in (w._to, w._from)}
    assert len(mine) == 2
    shared, code = in_forked_child(lambda: sorted(_pipe_inodes() & mine))
    assert code == 0 and shared == []  # the child closed its copies: the worker still ends with us alone
    compile_many(reqs, cache=FileStreamProgramCache(tmp_path / "p2"), processes=True, max_workers=1)


def _pipe_inodes() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return found


def test_settings_are_checked(monkeypatch) -> None:
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER", "sometimes")
    with pytest.raises(config.ConfigError, match="KERNELCACHE_COMPILE_SERVER="):
        config.compile_server()
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER", "auto")
    assert config.compile_server() is os.path.exists("/dev/nvidiactl")
    monkeypatch.delenv("KERNELCACHE_COMPILE_SERVER")
    assert config.compile_server() is os.path.exists("/dev/nvidiactl")  # auto unless told
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER", "0")
    assert config.compile_server() is False
    for bad in ("-1", "0", "soon", "nan", "1e9"):
        monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER_IDLE", bad)
        with pytest.raises(config.ConfigError, match="KERNELCACHE_COMPILE_SERVER_IDLE"):
            config.compile_server_idle_s()
    monkeypatch.setenv("KERNELCACHE_COMPILE_SERVER_IDLE", "2.5")
    assert config.compile_server_idle_s() == 2.5


def test_the_socket_and_its_lock_are_ours_alone(tmp_path, server_dir) -> None:
    out = child(str(tmp_path / "a"), 0, 2)
    for name in os.listdir(server_dir):
        st = os.lstat(os.path.join(server_dir, name))
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o077, name
    assert stat.S_IMODE(os.lstat(server_dir).st_mode) == 0o700
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(out["socket"])
    sock.sendall(b"nonsense\n")
    assert sock.recv(10) == b""  # anything but a request it knows: hung up on
    sock.close()


def test_the_cli_lists_and_stops_this_users_servers(tmp_path, server_dir) -> None:
    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "kernelcache", "compile-server", *args], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert json.loads(cli("--json")) == []
    first = child(str(tmp_path / "a"), 0, 2)
    other = child(str(tmp_path / "b"), 0, 2, CUDA_KERNELCACHE_TEST_VARIABLE="1")
    listed = json.loads(cli("--json"))
    assert sorted(r["socket"] for r in listed) == sorted([first["socket"], other["socket"]])
    assert all(r["given"] == 0 and alive(r["pid"]) for r in listed)  # their first processes took none
    assert cli("stop").strip() == "stopped 2 compile servers"
    wait_for(lambda: not any(alive(r["pid"]) for r in listed))
    assert "no compile server runs" in cli()
