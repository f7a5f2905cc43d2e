"""Which headers a compile read (NVRTC's -fdevice-time-trace), their digests, and the race rules.

NVRTC 13 has no -M/-E, but ``-fdevice-time-trace=<file>`` writes a JSON trace whose
"Processing Header File" events name every header it processed, nested and empty ones
included. compile_program turns that list into a *variant* (headers.variants): each header with
its place on the search path and its content digest, plus the names the texts probe
(headers.scan).

The search dirs are, in NVRTC's order for a quoted include: the directory of
``options.name``, the current directory, then the -I directories in flag order: the
bundled-headers root (``use_bundled_headers``: a user-writable copy, tracked like any other)
and ``include_path``. Only NVRTC's builtin headers, which exist inside the library alone, are
not tracked: their content is pinned by the NVRTC identity in the key.

Hashing a header is memoised per process by (inode, size, mtime, ctime), so a warm process
pays one stat per tracked header per look-up; a file whose timestamps are within the
filesystem's granularity of the moment it was hashed is never memoised (git's "racy"
rule), since a same-size rewrite within that tick would leave all four unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat as stat_mod
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kernelcache import forksafe
from kernelcache.headers.scan import HAS_INCLUDE, normalized
from kernelcache.keys.options import as_list
from kernelcache.keys.program_name import compiled_name
from kernelcache.memo import remember
from kernelcache.regular_file import NotRegularFileError, open_regular
from kernelcache.timestamps import changed_since, now_ns, only_ctime_since

_memo_lock = threading.Lock()
_digest_memo: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def _fresh_lock_in_child() -> None:
    global _memo_lock
    _memo_lock = threading.Lock()


forksafe.reset_function_in_child(_fresh_lock_in_child)
_MEMO_LIMIT = 65536


def file_digest(path: str) -> str | None:
    """SHA-256 hex of the file's content, or None if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _memo_lock:
        known = _digest_memo.get(path)
    if known is not None and known[0] == ident:
        return known[1]
    hashed_at = now_ns()
    try:
        digest = regular_file_sha256(path)
    except OSError:
        return None
    if digest is None:
        return None
    # Race (git's "racy" rule): a file stamped within its filesystem's granularity of the
    # moment we read it can be rewritten, same size, in that same tick, and (ino, size,
    # mtime, ctime) would not change. Such a digest is used now and not remembered: the
    # next look-up reads the file again, until its timestamps are safely in the past.
    if not changed_since(st, hashed_at):
        with _memo_lock:
            remember(_digest_memo, path, (ident, digest), _MEMO_LIMIT)
    return digest


def regular_file_sha256(path: str) -> str | None:
    """SHA-256 hex of the regular file at path (symlinks followed: include trees use them); None
    for anything else (a FIFO, a device, a directory), never waiting on it: a FIFO planted at a
    header path that a manifest records (another variant's) hung every look-up."""
    try:
        fd, _ = open_regular(path, follow=True)
    except NotRegularFileError:
        return None
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return hashlib.sha256(f.read()).hexdigest()
    finally:
        os.close(fd)


def workdir() -> str | None:
    """The current directory; None when it was deleted (os.getcwd() then raises)."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        return None


def search_dirs(options: Any, cwd: str | None = None) -> list[str]:
    """Absolute search directories in NVRTC's order (memoised): the main source's own
    directory (that of the program name, joined to the working directory), then the -I
    directories in flag order: include_path, and the bundled-headers root and its cccl
    subdirectory where their flag stands (headers.scan states the whole rule)."""
    cwd = cwd or os.getcwd()
    name = compiled_name(options, "c++")  # NVRTC searches the encoded name's directory
    include = getattr(options, "include_path", None)
    bundled = bundled_roots(options)
    memo_key = (
        cwd,
        name,
        include if isinstance(include, (str, type(None))) else tuple(include),
        bool(getattr(options, "no_source_include", None)),
        bundled,
    )
    dirs = _dirs_memo.get(memo_key)
    if dirs is None:
        own = normalized(os.path.join(cwd, os.path.dirname(name)))
        if getattr(options, "no_source_include", None):
            own = ""  # --no-source-include: no includer's directory is searched
        included = [normalized(os.path.join(cwd, d)) for d in as_list(include)]
        for at, root in reversed(bundled):
            root = normalized(os.path.join(cwd, root))
            included[at:at] = [root, os.path.join(root, BUNDLED_CCCL)]
        dirs = [own] + included
        remember(_dirs_memo, memo_key, dirs, 1024)
    return dirs


_dirs_memo: dict[tuple[Any, ...], list[str]] = {}
FIRST_INCLUDE = 1  # where the -I directories start among search_dirs() (angle-bracket names search from there)
_BUNDLED_FLAG = "--use-bundled-headers="
BUNDLED_CCCL = "cccl"  # NVRTC searches the root, then root/cccl (CCCL's cub/, thrust/, cuda/, nv/)
_INCLUDE_FLAG = "--include-path="


def first_include(options: Any) -> int:
    """Where the -I directories (include_path and the bundled root) start among search_dirs(options)."""
    return FIRST_INCLUDE


def bundled_roots(options: Any) -> tuple[tuple[int, str], ...]:
    """Each bundled-headers root NVRTC receives (``use_bundled_headers``), with how many
    include_path flags precede it, in flag order.

    The root and its ``cccl`` subdirectory are search directories like the -I ones (search_dirs
    puts both at the flag's place), their headers tracked like theirs: recorded by their place
    under them, so keys stay shareable between users whose roots differ. Not pinned by the key's
    toolchain identity: nvrtcInstallBundledHeaders writes its copy once into a user-writable
    directory (cuda.core's: ``$XDG_CACHE_HOME/cuda-python/nvrtc-bundled-headers``, ``~/.cache``
    without it) and NVRTC reads whatever that copy holds now (measured with NVRTC 13.5: an
    ``#error`` appended to its cuComplex.h fails the next compile). Search order, measured: a
    quoted name tries the includer's directory, then the root, then root/cccl, then
    include_path (cuda.core emits the root's flag first); an angle-bracket name the same
    without the includer's directory. The flags are cuda.core's own (``as_bytes``, about 12
    us), asked for only when the option is set: the directory is cuda.core's choice, read from
    the environment when the flags are made."""
    if not getattr(options, "use_bundled_headers", None):
        return ()
    try:
        flags = options.as_bytes("nvrtc")
    except Exception:  # cuda.core refuses the options: the compile fails the same way
        return ()
    roots = []
    includes = 0
    for flag in flags:
        text = flag.decode(errors="replace") if isinstance(flag, bytes) else str(flag)
        if text.startswith(_INCLUDE_FLAG):
            includes += 1
        elif text.startswith(_BUNDLED_FLAG):
            roots.append((includes, text[len(_BUNDLED_FLAG) :]))
    return tuple(roots)


# NVRTC processes this header (inside the library) first in every C++ compile; its event is the
# first a trace loses after an earlier failed traced compile (compilers.header_pass).
BUILTIN_HEADER = "__nv_nvrtc_builtin_header.h"


def headers_from_trace(trace_path: str, cwd: str) -> tuple[list[str] | None, str]:
    """(absolute paths of the headers the trace lists, "") or (None, why it is not usable).

    Usable: NVRTC wrote it and it is whole. A failed traced compile earlier in the process
    makes NVRTC drop the first header events of every later trace (measured with 13.5:
    the builtin header, the pre-includes and the source's first include go; deeper ones
    stay), so a trace without the builtin header is refused, however many it lists.
    """
    # NVRTC appends ".json" to the name it is given; accept both spellings.
    for candidate in (trace_path + ".json", trace_path):
        try:
            with open(candidate, "rb") as f:
                trace = json.load(f)
            break
        except (OSError, ValueError):
            continue
    else:
        return None, "NVRTC wrote no usable header trace"
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        return None, "NVRTC wrote no usable header trace"
    seen: dict[str, None] = {}
    whole = False
    for event in events:
        if isinstance(event, dict) and event.get("name") == "Processing Header File":
            detail = (event.get("args") or {}).get("detail")
            if isinstance(detail, str) and detail:
                whole = whole or os.path.basename(detail) == BUILTIN_HEADER
                seen[normalized(os.path.join(cwd, detail))] = None
    if not whole:
        return None, (
            "NVRTC's header trace is incomplete (an earlier traced compile in this process failed, and NVRTC "
            "then drops header events from every later trace: restart the process to cache again)"
        )
    return list(seen), ""


# What changed_during looks at (watched): (headers: there and unstamped since the start; places,
# each probe's found file and searched directory: unstamped; earlier, the files a probe would
# have found first: absent; on_paths, every directory on those paths: no symlink among them
# stamped since the start). A plain tuple: a NamedTuple costs every import that makes it.
Watch = tuple[list[str], list[str], list[str], list[str]]


def watched(
    digests: Mapping[str, str],
    probes: Sequence[tuple[Any, str, str, str, int, list[str]]],
    untraced: bool = False,
) -> Watch:
    """What changed_during checks for these headers and probes (headers.variants' resolved
    probes), as paths: built once, on the thread beside the compile, so that the check after
    it is a stat per path."""
    places: dict[str, None] = {}  # ordered, each once
    earlier: dict[str, None] = {}
    for _includer, how, _kind, name, at, searched in probes:
        if at >= 0:
            places[os.path.join(searched[at], name) if searched[at] else name] = None
        before = searched[: at if at >= 0 else len(searched)]
        if how == HAS_INCLUDE:
            places.update((place, None) for place in before if place)
        if untraced:  # __has_include too: a name with a directory part changes that directory, not the place
            earlier.update((os.path.join(place, name) if place else name, None) for place in before)
    on_paths: dict[str, None] = {}
    for path in (*digests, *places):
        _directories_on(path, on_paths)
    return list(digests), [p for p in places if p not in digests], list(earlier), list(on_paths)


def _directories_on(path: str, into: dict[str, None]) -> None:
    """Add every directory ``path`` is reached through (its parent, the parent's, ... up to
    the root or the first relative part), each once across calls."""
    parent = os.path.dirname(path)
    while parent and parent not in into:
        into[parent] = None  # its own parents are added now, or were with it
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up


def changed_during(watch: Watch, start_ns: int) -> list[str]:
    """Paths whose state at the end of the compile may not be what NVRTC read, each as "path
    (why)" (``watch``: watched(...) of the compile's headers and probes).

    Race: NVRTC reads each header at some moment of the compile and we hash it after. A
    header stamped at or after the start (mtime, or ctime: a rename or a copy keeping the
    mtime still moves it) may have been read before its change and hashed after. For a
    probe: a file at the place it resolved to that appeared during the compile (NVRTC may
    not have seen it), or, for __has_include, a searched directory whose entries changed (a
    file NVRTC saw may be gone). An #include that NVRTC followed is in the trace, so its
    disappearance shows as a missing header.

    ``earlier`` (watched with ``untraced``): the headers came from an earlier pass
    (compile.tracing), not from one over this compile, and the probes were resolved while it
    ran: a file now at a place a probe searched before the one it resolved to may have been
    created after that and read (or found) by NVRTC, which no trace says, so it counts as
    changed too. (A file created and removed again within the compile is not seen, as by a
    pass run after the compile.)

    Race: a symlink on the way to a header (the header itself, ``ln -sfn``; a directory, a
    deploy's ``current`` link switched to another release) repointed during the compile to a
    file stamped before it: NVRTC read the old target, the digest the new one, and the stat of
    the path (which follows links) shows only the target's old times. The link itself is new
    (a rename stamps its ctime too), so each path's links are checked by lstat: the header's
    own, and every directory on the way (``on_paths``). A real directory renamed onto the way
    (``mv v1 old && mv v2 v1``) is caught by its stamps: a rename moves a directory's ctime
    and not its mtime. Both move with every entry made or removed in it, which is no rename
    (refusing that would refuse every compile in a busy working directory), so a directory
    renamed and also written in during the compile is not seen.
    """
    headers, places, earlier, on_paths = watch
    out = []
    for path in headers:
        st = _followed(path, start_ns, out)
        if st is None:
            out.append(f"{path} ({GONE})")
        elif changed_since(st, start_ns):
            out.append(f"{path} ({TOUCHED})")
    for path in places:
        st = _followed(path, start_ns, out)  # None: not there, nothing NVRTC could have found there
        if st is not None and changed_since(st, start_ns):
            out.append(f"{path} ({TOUCHED})")
    out.extend(f"{path} ({APPEARED})" for path in earlier if os.path.isfile(path))
    for path in on_paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue  # gone: the headers under it are then gone too, and said so above
        if stat_mod.S_ISLNK(st.st_mode):
            if changed_since(st, start_ns):
                out.append(f"{path} ({RELINKED})")
        elif only_ctime_since(st, start_ns):
            out.append(f"{path} ({MOVED})")
    return out


def _followed(path: str, start_ns: int, out: list[str]) -> os.stat_result | None:
    """The stat of what ``path`` names now (None: nothing); a symlink at ``path`` itself
    stamped since ``start_ns`` is added to ``out``. One lstat where it is no link (the usual)."""
    try:
        st = os.lstat(path)
        if not stat_mod.S_ISLNK(st.st_mode):
            return st
        if changed_since(st, start_ns):
            out.append(f"{path} ({RELINKED})")
        return os.stat(path)
    except OSError:
        return None


GONE, REWRITTEN = "gone", "rewritten"  # what certainly changed during the compile
TOUCHED = "stamped at or after the compile's start"  # what may have: its timestamps say so
APPEARED = "appeared on the search path during the compile"  # before the place an #include resolved to
RELINKED = "a symlink replaced during the compile"  # on the way to a header: NVRTC may have read another file
MOVED = "a directory renamed or replaced during the compile"  # on the way to a header: the same


def why_not_stored(changed: Sequence[str]) -> str:
    """The not-stored reason for build_variant's ``changed``: it says a header changed only
    when one certainly did (gone, rewritten), else that its timestamps say it may have."""
    certain = [c for c in changed if c.endswith(f"({GONE})") or c.endswith(f"({REWRITTEN})")]
    if certain:
        return "a header changed during the compile: " + ", ".join(certain[:3])
    return "a header may have changed during the compile: " + ", ".join(changed[:3])
