"""The size cap kept in a cache directory: set once for everyone who opens that cache.

``kernelcache config --cache-dir DIR set max-size 20G`` writes ``<root>/config.toml``
(``max_size = "20G"``, or ``"none"``). Every process opening the cache uses it unless it is
given a cap of its own (``max_size_bytes=``, ``KERNELCACHE_MAX_SIZE``); ``kernelcache stats``
and ``kernelcache config`` show which one is in force. The file is read without following
a symlink and only if it is a regular file; one that cannot be used is one warning, and the
cap then comes from the default.
"""

from __future__ import annotations

import os

from kernelcache import config
from kernelcache.config import file as configfile
from kernelcache.log import WarnOnce
from kernelcache.stores.file.marker import FORMAT_DIR, ROOT_CONFIG
from kernelcache.stores.file.ops import publish, read_regular, stage
from kernelcache.stores.file.treesafety import is_team_root

NAME = ROOT_CONFIG
_MAX_FILE = 64 * 1024
_KEY = "max_size"
_warnings = WarnOnce()  # one per cap file


class FromDirectory:
    """The default of FileStreamProgramCache's max_size_bytes: the cap stored in its directory."""

    def __repr__(self) -> str:
        return "FROM_DIRECTORY"


FROM_DIRECTORY = FromDirectory()


def cap_of(root: str) -> int | None:
    """The cap stored in the cache directory at ``root`` (None: none stored, or "none")."""
    found = read(root)
    return None if found is None else found[0]


def path_of(root: str) -> str:
    return os.path.join(root, NAME)


def cap_for(root: str, team: bool | None = None) -> tuple[int | None, str]:
    """The cap in force for the cache at ``root`` and where it came from.

    A private cache: KERNELCACHE_MAX_SIZE (the environment or the config file), else the cap
    stored in the cache directory, else 10 GB. A team cache (``team``; None: opened with
    allow_shared and a team tree) is governed by its own settings: the cap stored in the
    directory, else 10 GB, for every member alike. A member's KERNELCACHE_MAX_SIZE limits only
    that member's private tiers (the memory tier): one member's 6 KB must not evict the team's
    entries down to one while everyone else's cap is 200 GB."""
    if team is None:
        team = config.allow_shared() and is_team_root(root)
    found = read(root)
    if team:
        member = " (KERNELCACHE_MAX_SIZE: this member's private tiers only)" if _member_cap_set() else ""
        if found is not None:
            return found[0], f"the team cache directory ({path_of(root)}){member}"
        return config.DEFAULT_MAX_SIZE, f"default: the team cache directory sets none{member}"
    if _member_cap_set():
        return config.max_size_bytes(), f"KERNELCACHE_MAX_SIZE ({configfile.source('KERNELCACHE_MAX_SIZE')})"
    if found is not None:
        return found[0], f"the cache directory ({path_of(root)})"
    return config.DEFAULT_MAX_SIZE, "default"


def _member_cap_set() -> bool:
    return bool((config.env_get("KERNELCACHE_MAX_SIZE") or "").strip())


def parse(text: str) -> int | None:
    """A cap as ``set max-size`` takes it: a size (``20G``, ``500MB``) or ``none`` (``0``: none too)."""
    return config.parse_cap(text)


def read(root: str) -> tuple[int | None] | None:
    """``(cap,)`` (None inside: no cap) when the directory holds one; None when it holds none."""
    path = path_of(root)
    try:
        raw, _ = read_regular(path, max_size=_MAX_FILE)
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn(path, f"cannot be read ({exc.strerror or exc})")
        return None
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        value = tomllib.loads(raw.decode("utf-8")).get(_KEY)
        if value is None:
            return None
        return (parse(str(value)),)
    except (ValueError, UnicodeDecodeError) as exc:
        _warn(path, f"holds no usable {_KEY} ({exc})")
        return None


def write(root: str, text: str, shared: bool) -> int | None:
    """Store the cap ``text`` in the cache at ``root``, atomically; return it in bytes (None: no cap)."""
    cap = parse(text)
    data = f'# kernelcache: settings of this cache directory (kernelcache config)\n{_KEY} = "{text.strip()}"\n'
    # Staged in the tree's tmp/ (where a dead writer's file is swept) and renamed: a reader
    # sees the old cap or the new one, never half a file.
    staging = os.path.join(root, FORMAT_DIR, "tmp")
    tmp = stage(staging if os.path.isdir(staging) else root, data.encode(), mode=0o664 if shared else 0o644)
    try:
        publish(tmp, path_of(root))
    except OSError:
        os.unlink(tmp)
        raise
    return cap


def _warn(path: str, why: str) -> None:
    _warnings.warn(path, f"the cache's cap file {path} {why}; the default cap is used", stacklevel=4)
