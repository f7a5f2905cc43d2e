"""Who may own and write a file store's tree: the rules checked when a store opens its root.

Compiled kernels are code: anyone who can write the tree can plant a kernel that your GPU
will run. So by default (private mode) the tree is created 0700 and a root that another
user owns, or that group or others can write, is refused; ``allow_shared=True`` accepts a
deliberately shared team cache.
"""

from __future__ import annotations

import os
import stat as stat_mod
from collections.abc import Sequence

from kernelcache import config


class UnsafeCacheDirError(PermissionError):
    """The cache root is owned by another user or writable by others."""


def make_tree(root: str, subdirs: Sequence[str], allow_shared: bool) -> None:
    """Create root (checked, see check_root) and its subdirectories, 0700 where created."""
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        # os.makedirs says only "File exists" when the root (or a parent) is a file.
        where = "KERNELCACHE_DIR" if config.cache_dir_is_from_env(root) else "the cache directory"
        raise NotADirectoryError(
            f"{where} {root!r} is not a directory (it or a parent is a file): "
            "point it at a directory (created if missing)"
        ) from None
    check_root(root, allow_shared)
    for d in subdirs:
        os.makedirs(d, mode=0o700, exist_ok=True)


def check_root(root: str, allow_shared: bool) -> None:
    """UnsafeCacheDirError unless root is yours and not writable by group or others (or allow_shared)."""
    if allow_shared:
        return
    st = os.stat(root)
    problem = None
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        problem = f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    elif st.st_mode & (stat_mod.S_IWGRP | stat_mod.S_IWOTH):
        problem = f"is writable by group or others (mode {stat_mod.filemode(st.st_mode)})"
    if problem:
        raise UnsafeCacheDirError(
            f"kernelcache refuses the cache directory {root!r}: it {problem}, so another "
            "user could plant kernels that your process would run. Use a private directory, "
            "or pass allow_shared=True (KERNELCACHE_ALLOW_SHARED=1, kernelcache --allow-shared) if this "
            "is a deliberately shared team cache."
        )
