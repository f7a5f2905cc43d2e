"""One process compiling the Triton kernel of tests/support/_triton_axpy.py (sm_90, no GPU) once
every process of a test has started: it waits at the gate argv[1] until argv[3] processes have
imported Triton (startline.arrive), then compiles BLOCK=argv[2]. Prints one JSON line:
{"compiled": compiles it ran, "hits": cache hits}."""

from __future__ import annotations

import json
import sys

from _triton_axpy import compile_sm90, listen
from startline import arrive


def main(gate: str, block: int, parties: int) -> None:
    events = listen()
    arrive(gate, parties)  # every process is started and has imported Triton: go together
    compile_sm90(block)
    print(json.dumps({"compiled": events.count(False), "hits": events.count(True)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
