"""A separate process using Triton's real cache hooks (run as a script by test_triton.py).

The manager class comes from the environment, as in a Triton user's process:
TRITON_CACHE_MANAGER (and TRITON_REMOTE_CACHE_BACKEND), KERNELCACHE_DIR. Prints one JSON
line with what it saw.

    put KEY VERSION NAMES...           put each member "VERSION:NAME", then the group
    put-partial KEY VERSION N NAMES... put the first N members, print "ready", then hang
    put-slow KEY VERSION NAMES...      put each member, print "ready", wait for a line on stdin (a long
                                        compile), put the group, then read every path Triton got back as
                                        CompiledKernel does: {"readable": whether each held its bytes}
    get KEY NAMES...                    get_group: {"group": {name: content} | null}
    get-hold KEY NAMES...               get_group, print its paths and pid, wait for a line on stdin, then
                                        read them again: {"intact": whether each still holds its bytes}
    read-loop KEY SECONDS NAMES...      get_group repeatedly: counts of complete/absent/mixed
    write-loop KEY SECONDS NAMES...     put groups of alternating versions until SECONDS pass
    compile KEY                         triton.compile a real @triton.jit kernel for sm_90 (no GPU
                                        needed): {"compiled": n, "hits": n, "cubin_sha256": ...}
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

from triton.runtime.cache import get_cache_manager

GROUP = "kern.json"  # Triton names a kernel's group after its metadata file


def _put(key: str, version: str, names: list[str]) -> dict[str, str]:
    manager = get_cache_manager(key)
    paths = {name: manager.put(f"{version}:{name}".encode(), name) for name in names}
    manager.put_group(GROUP, paths)
    return paths


def _get(key: str, names: list[str]) -> dict[str, str] | None:
    group = get_cache_manager(key).get_group(GROUP)
    if group is None:
        return None
    out = {}
    for name, path in group.items():
        with open(path, "rb") as f:
            out[name] = f.read().decode()
    return out


def _classify(group: dict[str, str] | None, names: list[str]) -> str:
    if group is None:
        return "absent"
    versions = {content.split(":", 1)[0] for content in group.values()}
    whole = sorted(group) == sorted(names) and all(group[n].endswith(":" + n) for n in names)
    return "complete" if whole and len(versions) == 1 else "mixed"


def _compile() -> dict:
    import hashlib

    from _triton_axpy import compile_sm90, listen

    events = listen()
    kernel = compile_sm90(256)
    return {
        "compiled": events.count(False),
        "hits": events.count(True),
        "cubin_sha256": hashlib.sha256(kernel.asm["cubin"]).hexdigest(),
        "files": sorted(kernel.metadata_group),
        "paths": sorted(kernel.metadata_group.values()),
    }


def main(argv: list[str]) -> None:
    warnings.simplefilter("ignore")
    cmd, key = argv[0], argv[1] if len(argv) > 1 else ""
    if cmd == "compile":
        print(json.dumps(_compile()))
    elif cmd == "put":
        print(json.dumps({"paths": _put(key, argv[2], argv[3:])}))
    elif cmd == "put-partial":
        manager = get_cache_manager(key)
        count, names = int(argv[3]), argv[4:]
        for name in names[:count]:
            manager.put(f"{argv[2]}:{name}".encode(), name)
        print("ready", flush=True)
        time.sleep(600)  # killed here, before the rest and the group
    elif cmd == "put-slow":
        manager = get_cache_manager(key)
        paths = {name: manager.put(f"{argv[2]}:{name}".encode(), name) for name in argv[3:]}
        print("ready", flush=True)
        sys.stdin.readline()
        manager.put_group(GROUP, paths)
        readable = True
        for name, path in paths.items():
            try:
                with open(path, "rb") as f:
                    readable = readable and f.read() == f"{argv[2]}:{name}".encode()
            except OSError:
                readable = False
        print(json.dumps({"readable": readable}))
    elif cmd == "get":
        print(json.dumps({"group": _get(key, argv[2:])}))
    elif cmd == "get-hold":
        group = get_cache_manager(key).get_group(GROUP) or {}
        held = {}
        for path in group.values():
            with open(path, "rb") as f:
                held[path] = f.read()
        print(json.dumps({"paths": sorted(held), "pid": os.getpid()}), flush=True)
        sys.stdin.readline()
        intact = bool(held)
        for path, data in held.items():
            try:
                with open(path, "rb") as f:
                    intact = intact and f.read() == data
            except OSError:
                intact = False
        print(json.dumps({"intact": intact}))
    elif cmd == "read-loop":
        counts = {"complete": 0, "absent": 0, "mixed": 0}
        deadline = time.time() + float(argv[2])
        while time.time() < deadline:
            counts[_classify(_get(key, argv[3:]), argv[3:])] += 1
        print(json.dumps(counts))
    elif cmd == "write-loop":
        deadline, rounds = time.time() + float(argv[2]), 0
        while time.time() < deadline:
            _put(key, f"v{rounds % 2}", argv[3:])
            rounds += 1
        print(json.dumps({"rounds": rounds}))
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv[1:])
