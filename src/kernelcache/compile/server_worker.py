"""A worker as the compile server (server.py) holds it: started, warmed up, then handed over or
let go. Its pipes and pidfd are what a process receives when it takes it."""

from __future__ import annotations

import os
import signal
import sys
import time

__all__ = ["HeldWorker", "still_idle"]


class HeldWorker:
    """A worker the server started: its pipes, its pidfd, how far it got."""

    def __init__(self) -> None:
        from kernelcache.compile import worker_proc

        self.proc, self.to, self.replies = worker_proc.spawn(worker_proc.worker_argv(sys.path), None)
        self.pidfd = os.pidfd_open(self.proc.pid)
        self.warm = False  # it said "ready" and answered the warm-up compile
        self.since = time.monotonic()
        self.written_off = False  # starting for so long that the server stopped counting on it

    def close(self) -> None:
        """Let it go: closing its request pipe ends it (worker_main._end_with_the_parent)."""
        self.to.close()
        self.replies.close()
        os.close(self.pidfd)

    def end(self) -> None:
        """End one that was never handed over: killed, since a stopped one would not see its
        pipe hang up and would outlive the server for good."""
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass  # ended already
        self.close()


def still_idle(worker: HeldWorker) -> bool:
    """Alive, and silent as an idle worker is. Race: a worker that died while idle is seen in
    the loop's next batch of events (EOF on its reply pipe), or later where its exit is slow;
    a request answered first would get it, and a process given two such in a row would fail
    that compile (its retry dead too). So its state is looked at when it is handed over."""
    return worker.proc.poll() is None and not worker.replies.poll(0)
