"""The name of a compile server (server.py): which processes may use the same one.

A server's socket is named by a fingerprint of everything a worker takes from the process
that starts it and does not take per compile (the working directory, the environment and
sys.path travel with every compile): the interpreter and its flags, the sys.path its start
imports from (its relative entries, '' among them, joined to the cwd: the server runs in /;
less the directories that hold nothing it imports then: server_sys_path) and what an install
rewrites on it (site-packages' dist-info entries, the files of cuda's and NVIDIA's packages;
not bytecode written there), kernelcache's own files, the variables read at start
(CUDA_*, NV*, LD_*, PYTHON*, LLVM_*, LIBNVVM*, PATH, CONDA_PREFIX), ids, cgroup,
namespaces and root directory (a chroot), CPU affinity, umask, limits, niceness. A process
that differs in any of them gets a server of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

from kernelcache.compile import worker_proc

__all__ = ["PROTOCOL", "fingerprint", "server_sys_path"]

PROTOCOL = "kernelcache-compile-server-2"


def fingerprint() -> str:
    """24 hex digits naming the server whose workers this process may use (module docstring)."""
    parts: dict[str, Any] = {
        "protocol": PROTOCOL,
        "python": [os.path.realpath(sys.executable), sys.version, list(sys.flags), worker_proc.boot_flags()],
        "path": server_sys_path(),
        "installed": _install_stamps(),
        "kernelcache": _package_stamps(),
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES),
        "ids": [os.geteuid(), os.getegid(), sorted(os.getgroups())],
        "proc": _proc_facts(),
        "nice": os.nice(0),
    }
    try:
        parts["cpus"] = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        parts["cpus"] = os.cpu_count()
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


# What the interpreter, the loader and cuda.pathfinder read at a worker's start (CONDA_PREFIX
# picks the libnvrtc loaded where no wheel has one), and what libnvrtc reads once, when it is
# loaded, rather than per compile (a getenv log of libnvrtc 13.0: NVRTC_*, NV_NVVM_VERSION,
# LIBNVVM_DISABLE_CONCURRENT_API, LLVM_OVERRIDE_PRODUCER, which goes into every LTO-IR, and
# AS_SECURE_LOG_FILE). What a compile reads at compile time travels with it.
_ENV_PREFIXES = ("CUDA", "NV", "LD_", "PYTHON", "LLVM_", "LIBNVVM")
_ENV_NAMES = ("PATH", "CONDA_PREFIX", "AS_SECURE_LOG_FILE")


def server_sys_path() -> list[str]:
    """sys.path as this process resolves it now: relative entries ('' included: the cwd, for
    ``python -c`` and the REPL) joined to the working directory, and dropped where it was
    deleted (nothing resolves there). The server and its workers run in /: given '' they
    import kernelcache and cuda from / or from further down sys.path, i.e. another copy or
    none (then no server ever came up, and every process waited for one).

    Less the directories that hold nothing a worker imports before its first compile (_inert):
    a script's directory, usually, so that ``python a/x.py`` and ``python b/y.py`` share a
    server. What a worker imports later resolves as in the process it serves: each compile
    brings that process's sys.path (worker_main._take_on)."""
    try:
        here: str | None = os.getcwd()
    except OSError:
        here = None
    resolved = [
        p if os.path.isabs(p) else os.path.normpath(os.path.join(here, p))
        for p in worker_proc.import_entries(sys.path)
        if here is not None or os.path.isabs(p)
    ]
    return [p for p in resolved if not _inert(p)]


# What a worker imports before its first compile, by top-level name: the standard library,
# kernelcache, cuda's and NVIDIA's packages, what ``site`` runs (where it runs: boot_flags),
# and private modules (_sysconfigdata_*, import hooks of .pth files). A directory on sys.path
# that holds none of these names changes nothing a warm worker imported. The test that a real
# worker imports nothing else: test_compile_server_fingerprint.py.
_START_NAMES = frozenset(sys.stdlib_module_names) | {"kernelcache", "cuda", "nvidia", "sitecustomize", "usercustomize"}
_inert_memo: dict[str, tuple[Any, bool]] = {}


def _inert(entry: str) -> bool:
    """``entry`` is a directory in which no module a worker imports at its start could be
    found: no file or directory named like one (a package, a namespace portion, a module, an
    extension). Anything that cannot be read counts as not inert."""
    import importlib.machinery

    try:
        st = os.stat(entry)
    except OSError:
        return False
    stamp = (st.st_dev, st.st_ino, st.st_mtime_ns)  # a name added or removed changes the mtime
    memo = _inert_memo.get(entry)
    if memo is not None and memo[0] == stamp:
        return memo[1]
    suffixes = importlib.machinery.all_suffixes()
    inert = False
    try:
        with os.scandir(entry) as found:
            names = [e.name if e.is_dir() else _module_name(e.name, suffixes) for e in found]
        inert = not any(n in _START_NAMES or (n.startswith("_") and n != "__pycache__") for n in names if n)
    except OSError:  # not a directory (a zip), unreadable
        pass
    if len(_inert_memo) > 256:
        _inert_memo.clear()
    _inert_memo[entry] = (stamp, inert)
    return inert


def _module_name(file: str, suffixes: list[str]) -> str:
    for suffix in suffixes:
        if file.endswith(suffix):
            return file[: -len(suffix)]
    return ""


def _stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path or ".")
    except OSError:
        return None
    return [st.st_ino, st.st_mtime_ns, st.st_size]


def _install_stamps() -> list[Any]:
    """What an install or upgrade of what a worker imports rewrites: the metadata entries of
    site-packages (a new or renamed dist-info), the files of cuda's packages, NVIDIA's library
    wheels. Not the other entries of sys.path: a script's directory (often /tmp, or the cwd)
    changes all the time."""
    import importlib.util

    sites = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    stamps = [[p, _entries(p, _METADATA)] for p in sites]
    # Found through the namespace packages, never an imported module's own __path__ or
    # origin: cuda.core rewrites its own on import (to cu13/), so they would differ by import.
    for top, subdirs in (("cuda", ("bindings", "core", "pathfinder")), ("nvidia", None)):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        for location in (spec and spec.submodule_search_locations) or ():
            if subdirs is None:  # nvidia/<wheel>/lib: libnvrtc and the other libraries (no bytecode there)
                with os.scandir(location) as entries:
                    stamps += [[e.path, _stamp(os.path.join(e.path, "lib"))] for e in entries if e.is_dir()]
            else:
                stamps += [[d, _entries(d, None)] for d in (os.path.join(location, sub) for sub in subdirs)]
    return stamps


# Why entries and not a directory's own mtime: a process's first import of a module writes its
# __pycache__ (a fresh image or venv, pip's --no-compile), which changes the mtime of the
# directory it is in, while no install happened: the fingerprint changed in mid-process and
# the node got a second server. An install writes these entries anew (new inodes, mtimes).
_METADATA = (".dist-info", ".egg-info", ".egg-link", ".pth")


def _entries(path: str, suffixes: tuple[str, ...] | None) -> list[Any] | None:
    """[name, inode, mtime] of the entries of ``path`` (only those ending in ``suffixes`` where
    given), never __pycache__; None where it cannot be listed."""
    try:
        with os.scandir(path) as it:
            found = []
            for entry in it:
                if entry.name == "__pycache__" or (suffixes and not entry.name.endswith(suffixes)):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                found.append([entry.name, st.st_ino, st.st_mtime_ns])
    except OSError:
        return None
    return sorted(found)


def _package_stamps() -> list[Any]:
    """(file, mtime, size) of every module of kernelcache: an edited checkout gets a new server."""
    global _PACKAGE
    if _PACKAGE is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        found = []
        for top, dirs, files in os.walk(root):
            dirs.sort()
            found += [[os.path.join(top, f), _stamp(os.path.join(top, f))] for f in sorted(files) if f.endswith(".py")]
        _PACKAGE = found
    return _PACKAGE


_PACKAGE: list[Any] | None = None


def _proc_facts() -> list[str]:
    """cgroup, namespaces, umask, root and limits, as /proc shows them (what a started process inherits)."""
    import resource

    facts = []
    for name in ("cgroup", "ns/mnt", "ns/pid", "ns/user", "ns/net", "ns/ipc", "ns/uts", "ns/cgroup", "attr/current"):
        try:
            path = f"/proc/self/{name}"
            facts.append(os.readlink(path) if name.startswith("ns/") else _read(path))
        except OSError:
            facts.append("")
    try:
        facts += [line for line in _read("/proc/self/status").splitlines() if line.startswith("Umask:")]
    except OSError:
        pass
    facts.append(_root())
    for limit in ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_CORE", "RLIMIT_NPROC"):
        facts.append(f"{limit}={resource.getrlimit(getattr(resource, limit))}")
    return facts


def _root() -> str:
    """Which root directory this process sees. A chroot has the same namespaces and paths
    but other files at them (headers, libraries): the mount its / is (a bind mount of the
    real / is another mount) and that directory's inode."""
    st = os.stat("/")
    mount = ""
    try:
        for line in _read("/proc/self/mountinfo").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) > 4 and fields[4] == "/":
                mount = fields[0]  # the last one listed is the one on top
    except OSError:
        pass
    return f"root={st.st_dev}:{st.st_ino}:{mount}"


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()
