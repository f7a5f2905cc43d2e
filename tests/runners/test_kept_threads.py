"""The threads kept for work beside a compile (runners.beside.on_a_thread): results and errors
handed back, at most one thread per core, and a forked child that uses its own. Real threads
and a real fork, each in a fresh interpreter (the pool is per process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_job_error_is_raised_by_result_each_time_it_is_asked() -> None:
    out = _run(
        """
        from kernelcache.runners.beside import on_a_thread
        def boom():
            raise ValueError("from the job")
        job = on_a_thread(boom)
        for _ in range(2):
            try:
                job.result()
            except ValueError as exc:
                print(exc)
        """
    )
    assert out.splitlines() == ["from the job", "from the job"]


def test_no_more_threads_than_cores_and_every_job_runs() -> None:
    # Race: jobs given while every thread is busy are queued; the invariant (idle = waiting
    # threads - queued jobs) must hand each to a thread that takes it, or result() hangs.
    out = _run(
        """
        import os, threading, time
        from kernelcache.runners import beside
        lock, running, peak, done = threading.Lock(), [0], [0], []
        def job(n):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.002 * (n % 3))
            with lock:
                running[0] -= 1
            done.append(n)
        for burst in range(20):
            jobs = [beside.on_a_thread(job, burst * 10 + n) for n in range(10)]
            for j in jobs:
                j.result()
        count = sum(t.name == "kernelcache-beside" for t in threading.enumerate())
        print(len(done), peak[0] <= (os.cpu_count() or 1), count == min(os.cpu_count() or 1, 10), beside._idle == count)
        """
    )
    assert out == "200 True True True"


def test_a_forked_child_runs_jobs_on_threads_of_its_own() -> None:
    out = _run(
        """
        import os, threading
        from kernelcache.runners.beside import on_a_thread
        on_a_thread(lambda: None).result()  # the parent's thread now exists (and waits for a job)
        pid = os.fork()
        if pid == 0:
            seen = []
            on_a_thread(lambda: seen.append(threading.current_thread().name)).result()
            os._exit(0 if seen == ["kernelcache-beside"] else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """
    )
    assert out == "0"
