"""One process compiling the Triton kernel of tests/support/_triton_axpy.py (sm_90, no GPU) once
every process of a test has started: it waits for the file argv[1] to appear, then compiles
BLOCK=argv[2]. Prints one JSON line: {"compiled": compiles it ran, "hits": cache hits}."""

from __future__ import annotations

import json
import os
import sys
import time

from _triton_axpy import compile_sm90, listen


def main(go: str, block: int) -> None:
    events = listen()
    deadline = time.monotonic() + 120
    while not os.path.exists(go):  # every process is started and has imported Triton: go together
        if time.monotonic() > deadline:
            raise SystemExit("never told to go")
        time.sleep(0.005)
    compile_sm90(block)
    print(json.dumps({"compiled": events.count(False), "hits": events.count(True)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
