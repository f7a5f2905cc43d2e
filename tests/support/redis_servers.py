"""Real redis-server processes on loopback ports, started and stopped by the tests."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time

import pytest

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def need_redis() -> None:
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port(cluster: bool = False) -> int:
    """A free loopback port; for a cluster node also its bus port (port + 10000, < 65536)."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 55000)
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a Redis cluster node")


class RedisServer:
    """One redis-server on 127.0.0.1:port, data in its own directory, no persistence."""

    def __init__(self, workdir: str, port: int | None = None, extra: tuple[str, ...] = ()) -> None:
        self.port = port or free_port(cluster="--cluster-enabled" in extra)
        self.dir = os.path.join(workdir, f"redis-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        self.extra = extra
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--protected-mode",
            "no",
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()

    def cli(self, *args: str) -> str:
        assert REDIS_CLI is not None
        out = subprocess.run([REDIS_CLI, "-p", str(self.port), *args], capture_output=True, text=True, timeout=20)
        return out.stdout.strip()

    def wait_ready(self, timeout: float = 20) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited with {self.proc.returncode}")
            if self.cli("ping") == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None


class RedisCluster3:
    """A 3-master Redis Cluster on loopback (no replicas)."""

    def __init__(self, workdir: str) -> None:
        self.nodes = [
            RedisServer(workdir, extra=("--cluster-enabled", "yes", "--cluster-node-timeout", "3000")) for _ in range(3)
        ]
        # Each node keeps its cluster state in nodes.conf inside its own --dir.
        assert REDIS_CLI is not None
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        end = time.time() + 30
        while time.time() < end:
            if all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("the Redis cluster did not reach cluster_state:ok")

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
