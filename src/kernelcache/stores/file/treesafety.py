"""Who may own and write a file store's tree: the owner and mode rules of private and team caches.

Compiled kernels are code: anyone who can write the tree can plant an artifact and a
matching sidecar, and the next process that looks the key up runs that code. So before a
file store uses a directory it checks every directory of the tree it creates (the root,
the format directory, entries/, tmp/, locks/ and every shard of entries/):

- private mode (the default): owned by you, not writable by group or others;
- team mode (``allow_shared=True``, ccache's model): group-writable and setgid, owned by you,
  by root, or by a member of the tree's group (the root's group);
- neither accepts a directory that others can write, or a symlink where a directory is
  expected. Directories of your own that lack a team mode's bits are repaired (chmod/chown);
  anything else wrong is refused with UnsafeCacheDirError naming the path.

The root is resolved once (os.path.realpath) and the store uses only that resolved path:
a symlinked root that its owner re-points later can no longer swap the tree under a live
store. What this does not cover: a directory *above* the root that another user can write
(they could rename the whole tree away); the root you choose is yours to choose.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from collections.abc import Sequence

from kernelcache import config
from kernelcache.log import WarnOnce
from kernelcache.stores.file.marker import write_marker

# Directories of a private cache: only their owner can enter them.
PRIVATE_DIR_MODE = 0o700
# Directories of a team cache: the group reads and writes, new entries inherit the group.
TEAM_DIR_MODE = 0o2770


class UnsafeCacheDirError(PermissionError):
    """The cache tree is owned by, or writable by, someone it should not be."""


def is_team_root(path: str) -> bool:
    """Whether ``path`` is a team cache's root: a real directory, setgid and group-writable
    (what ``kernelcache init --team`` makes). Anything else is not one, whoever asks."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISGID) and bool(st.st_mode & stat.S_IWGRP)


def make_root(given: str, team: bool, create: bool = True) -> tuple[str, bool]:
    """Create the root (and missing parents) if missing; return it with every symlink
    resolved (the store then uses only that path), and whether the tree is a team cache.
    ``create=False``: it must exist (FileNotFoundError), and nothing is changed.

    ``team`` (allow_shared) accepts a team cache; it never makes one out of a directory that
    exists: a directory the store did not create keeps its mode (a user's 755 directory of
    notes must not become group-writable because it was named). Such a directory is used as a
    private cache when it is one (yours, writable by you only), with one warning saying how to
    make a team cache; otherwise the tree check refuses it, naming the same. A root created
    here in team mode is made setgid and group-writable.
    """
    if not create:
        if not os.path.isdir(given):
            raise FileNotFoundError(errno.ENOENT, "no cache directory there", given)
        root = os.path.realpath(given)
        return root, team and is_team_root(root)
    existed = os.path.lexists(given)
    try:
        os.makedirs(given, mode=PRIVATE_DIR_MODE, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        # os.makedirs says only "File exists" when the root (or a parent) is a file. From
        # KERNELCACHE_DIR it is a bad environment value: ConfigError, which raises even where
        # an unusable directory only degrades to an uncached compile (default_cache_or_none).
        if config.cache_dir_is_from_env(given):
            raise config.ConfigError(
                f"KERNELCACHE_DIR={given!r} is not a directory (it or a parent is a file): "
                "point it at a directory (created if missing), or unset it"
            ) from None
        raise NotADirectoryError(
            f"the cache directory {given!r} is not a directory (it or a parent is a file): "
            "give a directory (created if missing)"
        ) from None
    root = os.path.realpath(given)
    if not team:
        return root, False
    if not existed:
        # Ours: made a team root now (mkdir masked the mode with the umask).
        os.chmod(root, TEAM_DIR_MODE)
        return root, True
    if is_team_root(root):
        return root, True
    st = os.lstat(root)
    if TreeCheck(root, team=False).problem(root, st) is None:
        _not_team.warn(
            root,
            f"{root} is not a team cache directory (mode {stat.filemode(st.st_mode)}): kernelcache uses it as "
            f"your private cache and leaves its mode as it is. {TEAM_HOW.format(root=root)}",
            stacklevel=5,
        )
    return root, False


# What to run instead of letting --allow-shared change an existing directory's mode.
TEAM_HOW = (
    "To share a cache with a group, make a team cache: `sudo kernelcache init --team GROUP {root}` "
    "(a new or empty directory), or give it the team modes yourself (chgrp GROUP, chmod 2770)"
)
_not_team = WarnOnce()


def make_tree(root: str, subdirs: Sequence[str], team: bool, *, mark: bool = False, create: bool = True) -> None:
    """Check the (resolved) root, create the subdirectories where missing, check each one and
    every shard of the entries/ among them (the one named "entries"); UnsafeCacheDirError.

    ``mark``: write the cache-root marker (marker.py) once the root passed its check, before
    anything is created in it: a tree this creates is never left without its proof.
    ``create=False``: check the subdirectories that exist, create none (and no marker).
    """
    tree = TreeCheck(root, team)
    tree.check(root)
    if mark and create:
        write_marker(root)
    for d in subdirs:
        if create:
            make_dir(d, team)
        elif not os.path.lexists(d):
            continue
        tree.check(d)
        if os.path.basename(d) == "entries":
            tree.check_shards(d)


def make_dir(path: str, team: bool) -> None:
    """Create one directory of the tree (no-op if it exists; its check comes after)."""
    try:
        os.mkdir(path, TEAM_DIR_MODE if team else PRIVATE_DIR_MODE)
    except FileExistsError:
        return
    if team:
        # mkdir masks the mode with the umask: set the group bits a team needs explicitly.
        os.chmod(path, TEAM_DIR_MODE)


class TreeCheck:
    """The rules of one tree: ``check(path)`` refuses or repairs one directory of it."""

    def __init__(self, root: str, team: bool) -> None:
        self.root = root
        self.team = team
        self._me = _me()
        self._gid = os.lstat(root).st_gid
        self._members: dict[int, bool] = {}

    def check(self, path: str) -> None:
        """UnsafeCacheDirError if path is not a directory this tree may contain."""
        st = os.lstat(path)
        problem = self.problem(path, st)
        if problem:
            raise UnsafeCacheDirError(self._message(path, problem))

    def check_shards(self, entries: str) -> None:
        """Check every shard directory of entries/ (files in them are opened O_NOFOLLOW)."""
        try:
            with os.scandir(entries) as it:
                shards = list(it)
        except FileNotFoundError:
            return
        for shard in shards:
            self.check(shard.path)

    def problem(self, path: str, st: os.stat_result) -> str | None:
        """Why path (lstat ``st``) may not be a directory of this tree (None: it may; a directory of
        a team tree that is yours and lacks the team's bits is repaired, below the root only)."""
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            return "is a symlink (a directory of the cache must be a real directory)"
        if not stat.S_ISDIR(mode):
            return f"is not a directory ({stat.filemode(mode)})"
        if mode & stat.S_IWOTH:
            return f"is writable by others (mode {stat.filemode(mode)})"
        if not self.team:
            if self._me is not None and st.st_uid != self._me:
                return f"is owned by uid {st.st_uid}, not by you (uid {self._me})"
            if mode & stat.S_IWGRP:
                return f"is writable by group (mode {stat.filemode(mode)})"
            return None
        if st.st_uid not in (self._me, 0) and not self._is_member(st.st_uid):
            return f"is owned by uid {st.st_uid}, who is not a member of the cache's group (gid {self._gid})"
        if mode & stat.S_IWGRP and st.st_gid != self._gid:
            return f"is writable by group {st.st_gid}, not by the cache's group (gid {self._gid})"
        lacking = st.st_gid != self._gid or (mode & TEAM_DIR_MODE) != TEAM_DIR_MODE
        if path != self.root and st.st_uid == self._me and lacking:
            # Ours but made by an older version or under another umask: repair it, so that
            # the other members can write (and the files they create keep the group). Never
            # the root: a directory that exists keeps the mode its owner gave it (make_root).
            if st.st_gid != self._gid:
                os.chown(path, -1, self._gid)
            os.chmod(path, stat.S_IMODE(mode) | TEAM_DIR_MODE)
        return None

    def _is_member(self, uid: int) -> bool:
        known = self._members.get(uid)
        if known is None:
            try:
                user = pwd.getpwuid(uid)
                group = grp.getgrgid(self._gid)
                known = user.pw_gid == self._gid or user.pw_name in group.gr_mem
            except KeyError:
                known = False  # an uid or group without a name: not a member we can tell
            self._members[uid] = known
        return known

    def _message(self, path: str, problem: str) -> str:
        where = "the cache directory" if path == self.root else f"{path!r} in the cache directory"
        head = f"kernelcache refuses {where} {self.root!r}: it {problem}, so "
        if self.team:
            return head + (
                "someone outside the team could plant kernels that your process would run. A team "
                "cache is group-writable and setgid, owned by members of its group, and not "
                "writable by others: fix the modes or owners (chmod/chown)."
            )
        return head + (
            "another user could plant kernels that your process would run. Use a private "
            "directory; for a team cache, open it with allow_shared=True (KERNELCACHE_ALLOW_SHARED=1, "
            f"kernelcache --allow-shared). {TEAM_HOW.format(root=self.root)}."
        )


def _me() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None
