"""A real S3-protocol server on loopback (moto's server mode), started and stopped by the tests,
and a real HTTP proxy in front of it that can fail every request, stall, or count requests."""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "kernelcache-test",
    "AWS_SECRET_ACCESS_KEY": "kernelcache-test",
    "AWS_REGION": "us-east-1",
    "AWS_ALLOW_HTTP": "true",
}


def need_object_store() -> None:
    pytest.importorskip("obstore", reason="obstore is not installed (pip install 'kernelcache[s3]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the dev extra installs it)")


class S3Server:
    """moto's ThreadedMotoServer on 127.0.0.1 (a free port), with buckets made through boto3."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"

    def client(self):  # noqa: ANN201 - a boto3 client
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_REGION"],
        )

    def bucket(self) -> str:
        """A new empty bucket's name."""
        name = f"kc-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self._server.stop()


def env_for(endpoint: str) -> dict[str, str]:
    """The environment obstore reads (credentials and endpoint), as a cloud's tools would set it."""
    return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 forwarding to ``upstream``; ``mode`` "pass", "fail" (500 to
    every request), "fail-reads" (500 to every GET of an object; listings pass), "stall"
    (hold every request for ``stall_s`` first) or "slow" (hold every request for ``stall_s``,
    then forward it: a store that answers, slowly). Counts requests."""

    def __init__(self, upstream: str, stall_s: float = 30.0) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.mode = "pass"
        self.stall_s = stall_s
        self.requests: list[tuple[str, str]] = []
        self.max_gets_in_flight = 0
        self._gets_in_flight = 0
        self._gate = threading.Condition()
        self._gate_target = 0
        self._gate_wait = 0.0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                proxy.requests.append((self.command, self.path))
                if self.command == "GET" and proxy._gate_target:
                    proxy._hold_get()
                if proxy.mode in ("stall", "slow"):
                    time.sleep(proxy.stall_s)
                object_get = self.command == "GET" and "list-type=" not in self.path
                if proxy.mode == "fail" or (proxy.mode == "fail-reads" and object_get):
                    self.send_response(500)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream
                conn.request(self.command, self.path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def hold_gets(self, target: int, wait_s: float = 3.0) -> None:
        """From now on hold each GET until ``target`` GETs are in flight (or ``wait_s`` passed):
        ``max_gets_in_flight`` then says how many a client sent together."""
        self._gate_target, self._gate_wait = target, wait_s

    def _hold_get(self) -> None:
        with self._gate:
            self._gets_in_flight += 1
            self.max_gets_in_flight = max(self.max_gets_in_flight, self._gets_in_flight)
            self._gate.notify_all()
            self._gate.wait_for(lambda: self._gets_in_flight >= self._gate_target, timeout=self._gate_wait)
        with self._gate:
            self._gets_in_flight -= 1

    def count(self, method: str | None = None) -> int:
        return sum(1 for m, _ in self.requests if method is None or m == method)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def closed_port_endpoint() -> str:
    """An endpoint on which nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def set_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    for name, value in env_for(endpoint).items():
        monkeypatch.setenv(name, value)


def iter_objects(server: S3Server, bucket: str) -> Iterator[str]:
    for page in server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            yield item["Key"]


os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata probe in tests
