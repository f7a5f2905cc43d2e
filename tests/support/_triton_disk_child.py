"""One process making the cache calls Triton makes for kernels, through whichever cache manager
the environment names (TRITON_CACHE_MANAGER, TRITON_CACHE_DIR, KERNELCACHE_DIR).

    python tests/support/_triton_disk_child.py calls FIRST COUNT      the calls of compiling/loading kernels
    python tests/support/_triton_disk_child.py compile FIRST COUNT    real triton.compile (sm_90, no GPU) of
                                                              COUNT variants, and their launchers' calls

For each kernel, as Triton 3.x does (compiler/compiler.py, runtime/build.py):
``get_group("<name>.json")``; on a miss one ``put`` per stage file (all stages, or the source
and the cubin with TRITON_STORE_BINARY_ONLY=1), the metadata JSON, then ``put_group``; every group
file is then read from its path (CompiledKernel). With TRITON_STORE_BINARY_ONLY=1 Triton
still puts the source (only the later stages are skipped). Then the launcher module: ``get_file`` of
``__triton_launcher<EXT_SUFFIX>`` under its own key, ``put`` of the built .so on a miss (and
``cuda_utils<EXT_SUFFIX>`` once per process). The files of ``calls`` have the sizes a small
kernel's have (measured with Triton 3.9 for sm_90); their bytes are fixed by the kernel's number.
Prints one JSON line: {"compiled": kernels put, "hits": groups found}.

``usage(root)`` is the one measure of a cache's disk use that the test and the benchmarks share.
Used by tests/test_triton_disk.py, benchmarks/bench_triton_disk.py and bench_integrations.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import sysconfig

from triton.runtime.cache import get_cache_manager

# Bytes of each stage file of a small elementwise kernel (axpy, sm_90, Triton 3.9).
STAGES = {"source": 3956, "ttir": 2706, "ttgir": 3183, "llir": 4820, "ptx": 5412, "cubin": 6744}
METADATA_BYTES = 1205
LAUNCHER_BYTES = 30_000  # a launcher .so (cuda_utils is about as large)
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def usage(root: str) -> dict[str, int]:
    """What ``du`` counts under root, root included, each inode once: files, directories,
    inodes (the two together), apparent bytes (``du -sb``: st_size, directories' too), the
    files' own apparent bytes, and allocated bytes (``du -sB1``: st_blocks * 512). Hard links
    to one file count once."""
    seen: dict[int, os.stat_result] = {}
    for d, dirs, names in os.walk(root):
        for name in [".", *dirs, *names]:
            st = os.lstat(os.path.join(d, name))
            seen[st.st_ino] = st
    dirs_n = sum(1 for st in seen.values() if stat.S_ISDIR(st.st_mode))
    return {
        "files": len(seen) - dirs_n,
        "dirs": dirs_n,
        "inodes": len(seen),
        "bytes": sum(st.st_size for st in seen.values()),
        "file_bytes": sum(st.st_size for st in seen.values() if not stat.S_ISDIR(st.st_mode)),
        "blocks_bytes": sum(st.st_blocks * 512 for st in seen.values()),
    }


def _bytes(label: str, size: int) -> bytes:
    seed = hashlib.sha256(label.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _binary_only() -> bool:
    return os.environ.get("TRITON_STORE_BINARY_ONLY", "").strip().lower() in ("1", "true", "yes", "on")


def _module(key: str, name: str, data: bytes) -> None:
    """runtime/build.py's _compile_so: the cached module, or build and put it."""
    cache = get_cache_manager(key)
    path = cache.get_file(f"{name}{SUFFIX}")
    if path is None:
        path = cache.put(data, f"{name}{SUFFIX}", binary=True)
    with open(path, "rb") as f:
        assert f.read() == data, path


def _group(i: int) -> tuple[str, dict[str, bytes]]:
    name = f"kern{i}"
    files = {f"{name}.{ext}": _bytes(f"{i}.{ext}", size) for ext, size in STAGES.items()}
    files[f"{name}.json"] = json.dumps({"name": name, "pad": "x" * (METADATA_BYTES - 30)}).encode()
    return name, files


def _load(group: dict[str, str], want: dict[str, bytes]) -> None:
    for member, path in group.items():
        with open(path, "rb") as f:
            assert f.read() == want[member], member  # what CompiledKernel reads


def calls(first: int, count: int) -> dict[str, int]:
    compiled = hits = 0
    _module(hashlib.sha256(b"cuda_utils").hexdigest(), "cuda_utils", _bytes("cuda_utils", LAUNCHER_BYTES))
    for i in range(first, first + count):
        name, files = _group(i)
        manager = get_cache_manager(hashlib.sha256(f"kernel {i}".encode()).hexdigest())
        group = manager.get_group(f"{name}.json")
        if group is None:
            compiled += 1
            group = {}
            for member, data in files.items():
                ext = member.rsplit(".", 1)[1]
                if ext == "json":
                    continue
                # The source is put whatever TRITON_STORE_BINARY_ONLY says (compiler.py).
                if not _binary_only() or ext in ("source", "cubin"):
                    group[member] = manager.put(data, member)
            group[f"{name}.json"] = manager.put(files[f"{name}.json"].decode(), f"{name}.json", binary=False)
            manager.put_group(f"{name}.json", group)
        else:
            hits += 1
        _load(group, files)
        key = hashlib.sha256(f"launcher {i}".encode()).hexdigest()
        _module(key, "__triton_launcher", _bytes(f"launcher {i}", LAUNCHER_BYTES))
    return {"compiled": compiled, "hits": hits}


def compile_real(first: int, count: int) -> dict[str, int]:
    from _triton_axpy import compile_sm90, listen

    events = listen()
    _module(hashlib.sha256(b"cuda_utils").hexdigest(), "cuda_utils", _bytes("cuda_utils", LAUNCHER_BYTES))
    for i in range(first, first + count):
        compile_sm90(64 << i)
        # No driver here, so no launcher is built: its cache calls, as build.py makes them.
        key = hashlib.sha256(f"launcher {i}".encode()).hexdigest()
        _module(key, "__triton_launcher", _bytes(f"launcher {i}", LAUNCHER_BYTES))
    return {"compiled": events.count(False), "hits": events.count(True)}


def main(argv: list[str]) -> None:
    run = {"calls": calls, "compile": compile_real}[argv[0]]
    print(json.dumps(run(int(argv[1]), int(argv[2]))))


if __name__ == "__main__":
    main(sys.argv[1:])
