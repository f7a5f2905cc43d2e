"""A process whose one thread writes entries while another forks: ``python _fork_writer.py ROOT SECONDS``.

Each forked child looks at the shard directories it inherited an fd of and reports (exit
status 3) when one of them stays locked for longer than any write holds it: the lock it
inherited from a write in progress, which it then holds for its whole life. Prints one
JSON line: forks, and children that reported such a lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time

from kernelcache import FileStreamProgramCache


def _shard_fds(entries: str) -> list[int]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.path.dirname(os.readlink(f"/proc/self/fd/{fd}")) == entries:
                fds.append(int(fd))
        except OSError:
            pass
    return fds


def _stays_locked(path: str) -> bool:
    """Locked at every one of 20 tries over 0.2 s (a write holds it for microseconds)."""
    for _ in range(20):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
        time.sleep(0.01)
    return True


def child(entries: str) -> int:
    paths = {os.readlink(f"/proc/self/fd/{fd}") for fd in _shard_fds(entries)}
    return 3 if any(_stays_locked(path) for path in paths) else 0


def main(root: str, seconds: float) -> dict[str, int]:
    cache = FileStreamProgramCache(root)
    cache["warm"] = b"x"
    entries = os.path.join(os.path.realpath(root), "v2", "entries")
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            cache[f"k{n % 4096}"] = b"y" * 2048
            n += 1

    writer = threading.Thread(target=write)
    writer.start()
    forks, locked, end = 0, 0, time.monotonic() + seconds
    pending: list[int] = []
    while time.monotonic() < end:
        pid = os.fork()
        if pid == 0:
            os._exit(child(entries))
        forks += 1
        pending.append(pid)
        while len(pending) > 20:  # a few children at a time: each lives a fraction of a second
            _, status = os.waitpid(pending.pop(0), 0)
            locked += os.waitstatus_to_exitcode(status) == 3
        time.sleep(0.002)
    stop.set()
    writer.join()
    for pid in pending:
        _, status = os.waitpid(pid, 0)
        locked += os.waitstatus_to_exitcode(status) == 3
    return {"forks": forks, "locked": locked}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]))), flush=True)
