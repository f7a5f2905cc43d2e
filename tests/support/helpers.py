"""Helpers shared by the test folders: real directories, real filesystems (tmpfs mounts), real processes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

ARCH = "sm_90"  # compiles target this arch on CPU-only machines (NVRTC needs no GPU)
SUPPORT = os.path.dirname(os.path.abspath(__file__))  # tests/support: the child scripts
TESTS = os.path.dirname(SUPPORT)
REPO = os.path.dirname(TESTS)  # the checkout: README.md, examples/, src/
EXAMPLE = os.path.join(REPO, "examples", "warm.toml")  # the README's warm manifest


def _gpu_available() -> bool:
    try:
        from cuda.core import Device

        Device(0).set_current()
        return True
    except Exception:
        return False


def support_script(name: str) -> str:
    """The path of a child script in tests/support (``name`` with its .py)."""
    return os.path.join(SUPPORT, name)


@contextlib.contextmanager
def mounted_tmpfs(size: str, *, read_only: bool = False) -> Iterator[str]:
    """A real tmpfs of ``size`` (e.g. "256k"); skips the test where mounting is not allowed."""
    point = f"/tmp/kc-mnt-{uuid.uuid4().hex[:8]}"
    os.makedirs(point)
    opts = f"size={size},mode=0700"
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", point], capture_output=True)
    if proc.returncode != 0:
        os.rmdir(point)
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", point], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(point)


@contextlib.contextmanager
def rewritten_once_read(path: os.PathLike[str], text: str) -> Iterator[threading.Event]:
    """``path`` replaced by a file of ``text`` on a thread the moment a reader next closes it
    (inotify): in the middle of a compile that reads it early and runs long after. The event says
    it was. Replaced, not rewritten in place: the first close may be another reader's (a header
    pass beside the compile), and the compile must then read one text or the other, never the
    empty file a truncating write leaves for a moment."""
    import _fswatch

    watch = _fswatch.Watch()
    watch.add(os.fspath(path), _fswatch.IN_CLOSE_NOWRITE)
    edited = threading.Event()

    def edit_once_read() -> None:
        if watch.events(120):
            staged = f"{os.fspath(path)}.{uuid.uuid4().hex}"
            with open(staged, "w") as f:
                f.write(text)
            os.replace(staged, path)
            edited.set()

    editor = threading.Thread(target=edit_once_read)
    editor.start()
    try:
        yield edited
    finally:
        editor.join(150)
        watch.close()


def settle_timestamps() -> None:
    """Let files written just now get older than the filesystem's clock tick.

    compile_program does not store a compile when a header it read is stamped at or after
    the compile's start on the kernel's coarse clock (1-10 ms ticks): a test that writes a
    header and compiles at once, and expects the next call to hit, waits this long first.
    """
    time.sleep(0.012)


def in_forked_child(run):  # noqa: ANN001, ANN201 - run: a function returning JSON-able data
    """``(run()'s result, exit code)`` of a real forked child (None as the result if it failed)."""
    import json

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            os.write(w, json.dumps(run()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    return (json.loads(data) if data else None), os.waitstatus_to_exitcode(status)


def running(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie (an orphan's zombie lasts until init reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def remount_read_only(point: str) -> None:
    subprocess.run(["mount", "-o", "remount,ro", point], check=True, capture_output=True)


def run_python(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """Run code in a fresh interpreter (a real separate process); return its stdout."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def gpu_child(mode: str, env: dict[str, str]) -> dict:
    """The JSON line a fresh ``_integration_gpu_child.py MODE`` process prints (Triton or CuPy on a GPU)."""
    import json

    out = subprocess.run(
        [sys.executable, support_script("_integration_gpu_child.py"), mode],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def kc(*args: str, cache: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run `kernelcache ...` as a separate process (python -m kernelcache is the same entry point)."""
    cmd = [sys.executable, "-m", "kernelcache", *args]
    if cache is not None:
        cmd += ["--cache-dir", cache]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
