"""Fork children while threads take hits on the default cache (KERNELCACHE_DIR, and
KERNELCACHE_REDIS_URL when set); print one JSON line: children that hung, the hits counted
in the disk tier's shared counters, and the hits taken."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import warnings

from kernelcache import default_cache
from kernelcache.stores.file.counters import FileStats

CHILDREN, CHILD_HITS, THREADS = int(sys.argv[1]), 10, 3


def main() -> None:
    warnings.simplefilter("ignore")
    cache = default_cache()
    cache[b"key"] = b"value"
    stop = threading.Event()
    taken = [0] * THREADS

    def hits(i: int) -> None:
        while not stop.is_set():
            assert cache.get(b"key") == b"value"
            taken[i] += 1

    threads = [threading.Thread(target=hits, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    pids = []
    for _ in range(CHILDREN):
        time.sleep(0.01)
        pid = os.fork()
        if pid == 0:
            for _ in range(CHILD_HITS):
                assert cache.get(b"key") == b"value"
            sys.exit(0)  # a normal exit: atexit writes this child's counts
        pids.append(pid)
    hung = 0
    deadline = time.monotonic() + 30
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    cache.close()
    counted = FileStats(os.path.join(os.environ["KERNELCACHE_DIR"], "v2", "stats")).snapshot()["hits"]
    print(json.dumps({"hung": hung, "counted": counted, "taken": sum(taken) + (CHILDREN - hung) * CHILD_HITS}))


if __name__ == "__main__":
    main()
