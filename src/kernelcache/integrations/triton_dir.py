"""Triton's own cache directory, for torch.compile's Inductor.

Inductor reads kernels there by path whatever Triton's cache manager is (inductor_loaded says
why), so where it runs, kernelcache's Triton manager also leaves each group there, written by
Triton's own FileCacheManager, and loads what Inductor emitted there on a miss. Triton itself is
always handed kernelcache's own copies of the checked bytes (triton.py).
"""

from __future__ import annotations

import os
import stat
import sys

from triton.runtime.cache import FileCacheManager

from kernelcache.integrations.materialized import same_content
from kernelcache.integrations.triton_files import warn_once

__all__ = ["inductor_loaded", "inductors_group", "mirror_group"]


def inductor_loaded() -> bool:
    """Whether torch.compile's Inductor runs in this process (its compile workers too).

    Inductor reads compiled kernels from Triton's own cache directory by path, whatever
    Triton's cache manager: its static CUDA launcher loads ``<TRITON_CACHE_DIR>/<key>/<kernel>.cubin``
    (without it, Triton builds a C launcher per kernel signature, a C compiler run each), and
    its FX-graph cache bundles that folder's files into its entries for other processes and
    hosts (its emitted bundles land there). Measured on the H200 host with a two-block model
    (benchmarks/bench_torch_fleet.py): without those files, first calls 1.1-1.3x slower than
    with Triton's own manager, warm and on a new node.
    """
    return "torch._inductor" in sys.modules


def mirror_group(key: str, filename: str, members: dict[str, bytes]) -> dict[str, str] | None:
    """The group written into Triton's own directory for ``key`` as Triton's FileCacheManager
    writes it (its code: atomic renames, its layout, its group file); name -> path.

    A group already there holding exactly these bytes is used as it is. None (warned once)
    when that directory cannot be written (Inductor then does without it). Only what
    kernelcache stores of a group goes there (its binary and metadata; IRs with
    TRITON_STORE_BINARY_ONLY=0).
    """
    try:
        mirror = FileCacheManager(key)
        there = _tritons_group(mirror, filename)
        # Used as it is only if it holds the bytes kernelcache checked: Triton's files are not
        # checked on read, and a flipped byte, or a member another version's writer left
        # (Triton replaces by path, member by member), would be what Triton loads.
        # Race: a peer may replace a file there after this compare (whole files, by rename):
        # only with another version of the key's kernel, as with Triton's own manager.
        if there is not None and all(name in there and same_content(there[name], members[name]) for name in members):
            return {name: there[name] for name in members}
        paths = {name: mirror.put(data, name, binary=True) for name, data in members.items()}
        mirror.put_group(filename, paths)
        return paths
    except (OSError, RuntimeError) as exc:  # RuntimeError: TRITON_CACHE_DIR set but empty (Triton's manager has none)
        cause = f"mirror-{getattr(exc, 'errno', None)}"
        warn_once(cause, f"cannot write Triton's own directory for Inductor ({exc}); copies stay ours")
        return None


def _tritons_group(manager: FileCacheManager, filename: str) -> dict[str, str] | None:
    """``manager.get_group``; None also for a group file it cannot read: Triton's
    RemoteCacheManager (over any backend, ours too) leaves one in Triton's directory, its
    child_paths a list of names where FileCacheManager expects name -> path. None, unread,
    for a group file that is not a regular file: Triton opens it plainly, and a FIFO left
    there (by whoever can write Triton's directory) would block that open forever."""
    group_file = os.path.join(manager.cache_dir, f"__grp__{filename}")
    try:
        if not stat.S_ISREG(os.lstat(group_file).st_mode):
            return None
    except OSError:
        return None  # no group file: what get_group answers too
    try:
        return manager.get_group(filename)
    except (AttributeError, TypeError):
        return None


def inductors_group(key: str, filename: str) -> dict[str, str] | None:
    """The group Inductor may have emitted into Triton's own directory, as Triton's own
    manager reads it; None (warned once) when that directory cannot be made or read: a miss,
    Triton compiles and kernelcache stores, as without Inductor."""
    try:
        return _tritons_group(FileCacheManager(key), filename)
    except (OSError, RuntimeError) as exc:  # RuntimeError: TRITON_CACHE_DIR set but empty
        warn_once(
            f"mirror-{getattr(exc, 'errno', None)}", f"cannot read Triton's own directory for Inductor ({exc}); a miss"
        )
        return None
