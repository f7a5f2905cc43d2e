"""Removing the tree of layout v1 (``<root>/v1``): only the files that layout wrote.

This version never reads v1's entries, so ``clear`` and ``prune`` take them away. A
directory named v1 is not proof of anything (a user's ``api/v1/routes.py`` under a root
that was mistaken for a cache), so a file goes only if its path and name are ones v1 gave
its files, and it is a regular file (a symlink is never followed nor removed); an artifact
only beside a sidecar with kernelcache's header. Directories go only once empty. Anything
else stays where it is.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod

from kernelcache.stores.file.ops import starts_with

OLD_FORMAT_DIR = "v1"
_SHARD = re.compile(r"[0-9a-f]{2}")
_ARTIFACT = re.compile(r"[0-9a-f]{64}")
_SIDECAR = re.compile(r"[0-9a-f]{64}\.meta")
_STAGED = re.compile(r"[0-9a-f]{32}\.tmp")
_LOCK = re.compile(r"(?:[0-9a-f]+|evict)\.lock")
_SIDECAR_MAGIC = b"kernelcache-sidecar "
_STATS_MAGIC = b"KCSTATS1"


def remove_v1_tree(root: str) -> int:
    """Remove layout v1's files under ``root`` (see the module docstring); the files removed."""
    base = os.path.join(root, OLD_FORMAT_DIR)
    if not _is_dir(base):
        return 0
    removed = 0
    entries = os.path.join(base, "entries")
    for shard in _listdir(entries) if _is_dir(entries) else []:
        shard_path = os.path.join(entries, shard)
        if not _SHARD.fullmatch(shard) or not _is_dir(shard_path):
            continue
        names = set(_listdir(shard_path))
        for name in sorted(names):
            path = os.path.join(shard_path, name)
            if _SIDECAR.fullmatch(name):
                ours = starts_with(path, _SIDECAR_MAGIC)
            else:
                ours = bool(_ARTIFACT.fullmatch(name)) and starts_with(path + ".meta", _SIDECAR_MAGIC)
            removed += ours and _unlink_regular(path)
        _rmdir(shard_path)
    for sub, pattern in (("tmp", _STAGED), ("locks", _LOCK)):
        directory = os.path.join(base, sub)
        for name in _listdir(directory) if _is_dir(directory) else []:
            if pattern.fullmatch(name):
                removed += _unlink_regular(os.path.join(directory, name))
    stats = os.path.join(base, "stats")
    if starts_with(stats, _STATS_MAGIC):
        removed += _unlink_regular(stats)
    for sub in ("entries", "tmp", "locks", ""):
        _rmdir(os.path.join(base, sub) if sub else base)
    return removed


def _is_dir(path: str) -> bool:
    try:
        return stat_mod.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _unlink_regular(path: str) -> bool:
    try:
        if not stat_mod.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)  # only if empty: whatever was not ours keeps its directory
    except OSError:
        pass
