"""The cache-root marker: the file that proves a directory is a kernelcache cache root.

A destructive command (``clear``, ``prune``, ``verify --fix``, ``demo --clear-cache``) given
a directory that is not a cache must remove nothing. The code that creates a cache tree
writes ``<root>/CACHEDIR.TAG`` first (FileStreamProgramCache creating its ``v2/``,
``kernelcache init --team``); every destructive command calls :func:`require_cache_root`
before it opens the store. The file follows the Cache Directory Tagging convention (backup
tools such as ``tar --exclude-caches`` skip the tree) and carries a line of kernelcache's
own: another tool's CACHEDIR.TAG proves nothing to us and is never replaced.

A tree made by a version without the marker is *adopted* (the marker written then) only if
everything in it is recognisably kernelcache's: ``v2/`` holding nothing but entries/, tmp/,
locks/ and a counters file with kernelcache's magic, shards named by two hex digits holding
nothing but entries and sidecars named by the digest rule, every sidecar with kernelcache's
header. Anything else (a user's file, a directory we did not make) and the root is refused,
the refusal naming the path in the way.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat as stat_mod
import uuid

from kernelcache.log import logger
from kernelcache.regular_file import open_regular
from kernelcache.stores.file.ops import starts_with

__all__ = [
    "COPIES_DIR",
    "FORMAT_DIR",
    "MARKER_NAME",
    "TIER_COUNTERS",
    "ROOT_CONFIG",
    "NotACacheRootError",
    "has_marker",
    "holds_only_ours",
    "require_cache_root",
    "tier_counters_path",
    "tree_exists",
    "write_marker",
]

MARKER_NAME = "CACHEDIR.TAG"
_SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
_OURS = b"# kernelcache-root 1"
MARKER_CONTENT = (
    _SIGNATURE + b"\n"
    b"# This file is a cache directory tag created by kernelcache (a CUDA compile cache).\n"
    + _OURS
    + b"\n# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
_MAX_MARKER = 4096  # a marker is a few lines: a bigger file there is not ours

# The directory of this version's layout under the root, and what it may hold (see
# FileStreamProgramCache's layout).
FORMAT_DIR = "v2"
# The tiers of the default cache that count into files of this tree (FileStreamProgramCache.tier_counters).
TIER_COUNTERS = ("memory", "bundle", "redis", "object")
_V2_CHILDREN = frozenset(
    {"entries", "tmp", "locks", "stats", "index", *(f"stats.{tier}" for tier in TIER_COUNTERS)}
)  # index: headers.index
# The root's cap file (stores/file/dircap.py), and every name kernelcache gives a file in a
# root: layout v1's tree, Triton's materialized copies, the marker.
ROOT_CONFIG = "config.toml"
COPIES_DIR = "materialized"  # copies of entries handed out as files (integrations/materialized.py)
# oci/: the bundles KERNELCACHE_BUNDLES=oci://... pulled (stores/bundle/pulled.py); no tool removes them.
_ROOT_CHILDREN = frozenset({FORMAT_DIR, "v1", COPIES_DIR, "oci", ROOT_CONFIG, MARKER_NAME})
# Compiled on first use (re caches them), not at import: only a fresh root and destructive commands ask.
_SHARD = r"[0-9a-f]{2}"
_ENTRY = r"[0-9a-f]{64}(\.meta)?"
_STATS_MAGIC = b"KCSTATS1"
_SIDECAR_MAGIC = b"kernelcache-sidecar "


class NotACacheRootError(ValueError):
    """A destructive command was given a directory that is not a kernelcache cache root."""


def tier_counters_path(root: str, tier: str) -> str:
    """Where the default cache's ``tier`` counts this node's look-ups, in the cache at ``root``."""
    return os.path.join(root, FORMAT_DIR, f"stats.{tier}")


def tree_exists(root: str) -> bool:
    """Whether root holds this layout's tree (a real directory ``<root>/v2``): the reading
    commands work only on one, and never create it."""
    try:
        return stat_mod.S_ISDIR(os.lstat(os.path.join(root, FORMAT_DIR)).st_mode)
    except OSError:
        return False


def holds_only_ours(root: str) -> bool:
    """Whether every name in root is one kernelcache gives its files there (an empty root
    too). Only such a root is marked: the tag makes backup tools skip the whole directory,
    and a user's directory that also holds a cache must still be backed up."""
    try:
        names = os.listdir(root)
    except OSError:
        return False
    return all(name in _ROOT_CHILDREN or name.startswith(f".{MARKER_NAME}.") for name in names)


def has_marker(root: str) -> bool:
    """Whether ``root`` holds kernelcache's marker (a regular file, read without following links)."""
    try:
        fd, _ = open_regular(os.path.join(root, MARKER_NAME))
    except OSError:
        return False
    try:
        head = os.read(fd, _MAX_MARKER + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    return len(head) <= _MAX_MARKER and head.startswith(_SIGNATURE) and _OURS in head.splitlines()


def write_marker(root: str) -> bool:
    """Write kernelcache's marker into the existing directory ``root``; True if written now.

    False if it is already there, or if another tool's CACHEDIR.TAG is (it is never
    replaced; the root then stays unproven). The file appears whole or not at all: written
    under a temporary name, then hard-linked to its name (a link never replaces a file, so
    two processes creating one tree at once leave one marker). OSError if ``root`` cannot
    be written.
    """
    path = os.path.join(root, MARKER_NAME)
    if os.path.lexists(path):
        return False
    tmp = os.path.join(root, f".{MARKER_NAME}.{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            os.write(fd, MARKER_CONTENT)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def require_cache_root(root: str, action: str) -> None:
    """Return if ``root`` is a kernelcache cache root; NotACacheRootError (one line) otherwise.

    ``action`` names what was refused ("clear", "prune"...). A tree of a version without
    the marker is adopted when everything in it is recognisably ours (see the module
    docstring): the marker is written and the command goes on.
    """
    if has_marker(root):
        return
    why = _unadoptable(root)
    if why is None:
        try:
            write_marker(root)
        except OSError as exc:
            why = f"its marker could not be written ({exc.strerror})"
        else:
            if has_marker(root):
                logger.info("adopted %s as a kernelcache cache root (its tree is all kernelcache's)", root)
                return
            why = f"its {MARKER_NAME} was written by another tool"
    raise NotACacheRootError(
        f"refusing to {action} {root}: it is not a kernelcache cache root (no {MARKER_NAME} written "
        f"by kernelcache, and {why}); nothing was removed"
    )


def _unadoptable(root: str) -> str | None:
    """Why the markerless tree at root cannot be taken for a kernelcache tree (None: it can)."""
    base = os.path.join(root, FORMAT_DIR)
    if not holds_only_ours(root):
        stray = sorted(set(os.listdir(root)) - _ROOT_CHILDREN)
        return f"{os.path.join(root, stray[0]) if stray else root} is no file of kernelcache's"
    try:
        if not stat_mod.S_ISDIR(os.lstat(base).st_mode):
            return f"{base} is not a directory"
        children = os.listdir(base)
    except FileNotFoundError:
        return f"it holds no {FORMAT_DIR}/ tree"
    except OSError as exc:
        return f"{base} cannot be read ({exc.strerror})"
    stray = sorted(set(children) - _V2_CHILDREN)
    if stray:
        return f"{os.path.join(base, stray[0])} is no file of kernelcache's"
    if not starts_with(os.path.join(base, "stats"), _STATS_MAGIC):
        return f"{os.path.join(base, 'stats')} is not kernelcache's counters file"
    for sub in ("tmp", "locks"):
        why = _flat_files(os.path.join(base, sub))
        if why:
            return why
    return _entries_problem(os.path.join(base, "entries"))


def _flat_files(directory: str) -> str | None:
    """None if directory is absent or holds only regular files (staged files, lock files)."""
    try:
        with os.scandir(directory) as it:
            for f in it:
                if not f.is_file(follow_symlinks=False):
                    return f"{f.path} is no file of kernelcache's"
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{directory} cannot be read ({exc.strerror})"
    return None


def _entries_problem(entries: str) -> str | None:
    try:
        shards = list(os.scandir(entries))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{entries} cannot be read ({exc.strerror})"
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False) or not re.fullmatch(_SHARD, shard.name):
            return f"{shard.path} is no shard of kernelcache's"
        try:
            files = list(os.scandir(shard.path))
        except OSError as exc:
            return f"{shard.path} cannot be read ({exc.strerror})"
        for f in files:
            if not f.is_file(follow_symlinks=False) or not re.fullmatch(_ENTRY, f.name):
                return f"{f.path} is no entry of kernelcache's"
            if f.name.endswith(".meta") and not starts_with(f.path, _SIDECAR_MAGIC):
                return f"{f.path} is no sidecar of kernelcache's"
    return None
