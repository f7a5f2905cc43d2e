"""Header variants: what one compile of a source read, checked again on every look-up.

A variant holds
- ``headers``: each header the trace listed, with its content SHA-256, recorded as *how it
  was found* (headers.scan states the rule): ``[kind, includer, name, place, digest]`` for
  one that a literal name found (kind "q" or "a"; includer -1 for the main source, else the
  position of an earlier header; place: the index among scan.candidates), so a look-up
  derives its path again from its own working directory and search path; else (a name
  spelled by a macro, ``#include_next``) ``[search dir index, path relative to it, digest]``
  under the deepest search dir holding it, or ``[-1, absolute path, digest]`` outside all
  (the variant then also records ``cwd`` and matches only there: how NVRTC found it is
  unknown);
- ``probes``: each literal name the source and its headers look for (headers.scan) as
  (includer, kind, name, where it resolved or -1): the includer is -1 for the main source,
  else the position of its header in ``headers``;
- ``first_include``: where include_path starts among the search dirs (angle-bracket names).

A variant matches when every header still has its content, none is shadowed by a new file
earlier on the search path, and every probe resolves where it did. Its digest (all three
parts) completes the entry key.

Building a variant after a compile also decides whether the compile may be stored: a
header or probed place that changed at or after the compile's start (ccache's rule, with
the filesystem's timestamp granularity), or whose content differs from the digest read
before the compile, may not be what NVRTC read. Such a compile is returned, not stored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache.headers import scan as includes
from kernelcache.headers.digests import GONE, REWRITTEN, changed_during, file_digest, watched
from kernelcache.headers.records import probes_of, variant_bytes, variant_digest, variant_from_bytes
from kernelcache.headers.scan import entry_paths
from kernelcache.memo import remember

__all__ = [  # the record codec lives in headers.records; callers reach it from here too
    "build_variant",
    "header_paths",
    "probes_of",
    "tracked_paths",
    "variant_bytes",
    "variant_digest",
    "variant_from_bytes",
    "variant_matches",
]

if TYPE_CHECKING:
    from kernelcache.headers.index import HeaderIndex
    from kernelcache.headers.watch import Look

MANIFEST_FORMAT = 4  # 4: variants as records of their own; 3: headers derived from probes (older ones are a miss)
MAX_VARIANTS = 8  # header versions remembered per source (switching back is still a hit)

_directives_memo: dict[str, list[tuple[str, str, str]]] = {}  # content digest -> directives


def _directives_of(path: str, digest: str) -> list[tuple[str, str, str]] | None:
    """The directives of the header whose content has ``digest``; None if it changed meanwhile."""
    found = _directives_memo.get(digest)
    if found is None:
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError:
            return None
        if hashlib.sha256(text).hexdigest() != digest:
            return None  # rewritten between hashing and reading: the caller does not store
        found = includes.directives(text)
        remember(_directives_memo, digest, found, 16384)
    return found


def build_variant(
    headers: Sequence[str],
    dirs: Sequence[str],
    first_include: int,
    source: bytes,
    pre_include: Sequence[str],
    start_ns: int,
    before: Mapping[str, str],
    option_macros: Sequence[tuple[str, str, str]] = (),
    index: HeaderIndex | None = None,
    untraced: bool = False,
) -> tuple[dict[str, Any], list[str], Callable[[], list[str]]]:
    """(the variant for the headers one compile read, the paths that changed during it, each
    as "path (why)": see why_not_stored, and a function that checks those paths again).

    ``option_macros``: includes.option_macros(options), names the options' macros hold;
    ``index``: the cache's headers.index (the digests read now are remembered there).
    Built while the compile still runs (the header pass beside it, compile.tracing), the
    variant is only true once the check runs again after the compile: a header changed since
    it was read here is stamped at or after ``start_ns``, which that check sees. ``untraced``:
    ``headers`` came from an earlier pass, not this compile's (digests.changed_during)."""
    texts: dict[str | None, list[tuple[str, str, str]]] = {None: includes.directives(source)}
    texts[None] += [(includes.INCLUDE, "q", name) for name in pre_include]
    digests, changed = _read_headers(headers, before, texts, index.digest if index else file_digest)
    # Probes, resolved now against the files as they are; the race checks below make sure
    # "now" is what NVRTC saw.
    probes = _resolve_probes(includes.probes(texts, option_macros), dirs, first_include)
    again = watched(digests, probes, untraced)  # joined here, beside the compile: after it, a stat per path
    # Now, the files a probe would have found first are not looked at yet (they are once the
    # compile ended: untraced); the rest is checked now and again after it.
    changed += changed_during((again[0], again[1], [], again[3]), start_ns)
    entries, position, bound = _header_entries(digests, dirs, probes)
    recorded: dict[tuple[int, str, str], int] = {}
    for includer, _how, kind, name, at, _places in probes:
        where = -1 if includer is None else position.get(includer, -2)
        if where != -2:
            recorded.setdefault((where, kind, name), at)
    variant: dict[str, Any] = {
        "headers": entries,
        "probes": sorted([w, k, n, at] for (w, k, n), at in recorded.items()),
        "first_include": first_include,
    }
    if bound:
        variant["cwd"] = os.getcwd()
    variant["digest"] = variant_digest(variant)
    return variant, sorted(set(changed)), lambda: changed_during(again, start_ns)


def _read_headers(
    headers: Sequence[str],
    before: Mapping[str, str],
    texts: dict[str | None, list[tuple[str, str, str]]],
    digest_of: Callable[[str], str | None],
) -> tuple[dict[str, str], list[str]]:
    """(path -> content digest of each header the trace listed, the paths that changed); the
    directives of each header's text are added to ``texts``."""
    changed: list[str] = []
    digests: dict[str, str] = {}
    for path in sorted(headers):
        digest = digest_of(path)
        if digest is None:
            if os.path.basename(path).startswith("__nv"):
                continue  # NVRTC's builtin headers exist only inside the library
            changed.append(f"{path} ({GONE})")  # listed by the trace, gone now
            digest = "unreadable"
        elif path in before and before[path] != digest:
            changed.append(f"{path} ({REWRITTEN})")  # not the content this process saw before the compile
        digests[path] = digest
        found = _directives_of(path, digest) if digest != "unreadable" else []
        if found is None:
            changed.append(f"{path} ({REWRITTEN})")
            found = []
        texts[path] = found
    return digests, changed


_Probe = tuple[str | None, str, str, str, int, list[str]]  # includer, how, kind, name, where found, places


def _resolve_probes(
    texts: Mapping[str | None, Sequence[tuple[str, str, str]]], dirs: Sequence[str], first_include: int
) -> list[_Probe]:
    """Each probe resolved against the files as they are (its includer's directory: the
    path the trace gave that header)."""
    probes: list[_Probe] = []
    for includer, found in texts.items():
        includer_dir = os.path.dirname(includer) if includer is not None else None
        for how, kind, name in found:
            places = includes.candidates(kind, name, includer_dir, dirs, first_include)
            probes.append((includer, how, kind, name, includes.resolve(name, places), places))
    return probes


def _header_entries(
    digests: Mapping[str, str], dirs: Sequence[str], probes: Sequence[_Probe]
) -> tuple[list[list[Any]], dict[str, int], bool]:
    """(the variant's header entries, each path's position, whether one is kept absolute).

    Each header is recorded as the first probe that finds it, in the order NVRTC reads
    (the main source's probes, then those of the headers they find, breadth first), so an
    entry's includer always comes before it; the headers no literal name finds are kept
    by their place under a search dir (or absolute)."""
    by_includer: dict[str | None, list[_Probe]] = {}
    for probe in probes:
        by_includer.setdefault(probe[0], []).append(probe)
    entries: list[list[Any]] = []
    position: dict[str, int] = {}
    queue: list[str | None] = [None]
    for includer in queue:
        for _inc, _how, kind, name, at, places in by_includer.get(includer, ()):
            if at < 0:
                continue
            path = includes.normalized(os.path.join(places[at], name) if places[at] else name)
            if path in digests and path not in position:
                position[path] = len(entries)
                entries.append([kind, -1 if includer is None else position[includer], name, at, digests[path]])
                queue.append(path)
    bound = False
    for path, digest in digests.items():
        if path not in position:
            position[path] = len(entries)
            index, rel = _locate(path, dirs)
            bound = bound or index < 0
            entries.append([index, rel, digest])
    return entries, position, bound


def _locate(path: str, dirs: Sequence[str]) -> tuple[int, str]:
    """(search dir index, relative path) of the deepest search dir holding ``path``.

    The deepest, not the first: with cwd=/p and include_path=[/p/inc], /p/inc/a.h was found
    as "a.h" through /p/inc, and a new /p/a.h (in cwd, earlier) would shadow it. Recording
    it as "inc/a.h" under cwd would miss that. Erring this way can only cost a miss.
    """
    best = None
    for i, d in enumerate(dirs):
        if d and path.startswith(d.rstrip(os.sep) + os.sep) and (best is None or len(d) > len(dirs[best])):
            best = i
    if best is None:
        return -1, path  # outside every search dir: kept absolute
    return best, path[len(dirs[best].rstrip(os.sep)) + 1 :]  # as it is: no relpath, which drops ".." parts


def variant_matches(variant: dict[str, Any], dirs: Sequence[str], look: Look | None = None) -> bool:
    """True when every header the variant names, at the path the current working directory
    and search path give it, still has its recorded content, none is shadowed, and every
    probed name resolves where it did.

    ``look``: this look-up's view of the cache's headers.index (a stat per header and per
    directory searched where its facts hold, none where this process watches them)."""
    if look is None:
        digest_of: Callable[[str], str | None] = file_digest
        is_file: Callable[[str], tuple[bool, bool]] = lambda path: (os.path.isfile(path), False)  # noqa: E731
    else:
        digest_of, is_file = look.digest, look.is_file
    try:
        if "cwd" in variant and variant["cwd"] != os.getcwd():
            return False  # a header found by a name kernelcache cannot see, outside every search dir
        key = (variant["digest"], tuple(dirs))
        if look is not None and look.variant_known(key):
            return True  # matched under watch in this process, nothing changed since (headers.watch)
        paths = _paths_memo.get(key)
        if paths is None:
            derived = entry_paths(variant, dirs)
            if None in derived:
                return False  # fewer search dirs than it was found with
            paths = [str(p) for p in derived]
            remember(_paths_memo, key, paths, 4096)
        absent = set()  # paths this call saw missing, and (paths) those it saw present:
        for entry, path in zip(variant["headers"], paths):  # probes reuse both, no stat
            if not isinstance(entry[0], str) and entry[0] >= 0:
                # Shadowing: an earlier search dir that now holds the same relative name wins
                # (a file: NVRTC passes over a directory of that name, as includes.resolve does).
                for earlier in dirs[: entry[0]]:
                    shadow = f"{earlier}{os.sep}{entry[1]}"
                    if earlier and is_file(shadow)[0]:
                        return False
                    absent.add(shadow)
            if digest_of(path) != entry[-1]:
                return False
        held = _probes_hold(variant, dirs, paths, absent, is_file, look)
        if held and look is not None and not absent:  # shadow checks are not watched: no whole trust
            look.variant_held(key)
        return held
    except (TypeError, ValueError, IndexError, KeyError):
        return False  # a malformed variant (not written by this code) never matches


def _probes_hold(
    variant: dict[str, Any],
    dirs: Sequence[str],
    paths: list[str],
    absent: set[str],
    is_file: Callable[[str], tuple[bool, bool]],
    look: Look | None,
) -> bool:
    """Whether every probe of the plan resolves where it did (its headers already checked).

    Proved once per state of the directories the probes search (Look.holds): while no
    entry was created, removed or renamed in any of them (their mtimes and ctimes stay), each
    probe's answer stays. Race: the state is read before the listings that prove the answers;
    a directory changed in between has another state by the next look-up, which then proves
    again. An answer no listing proves (a symlink entry: its target may change where no
    listing sees it; a directory too big to list) is kept in the proof with the place, and
    asked again by a stat at each use. A proof is kept only when every state is safely past
    (the racy rule)."""
    key = _proof_key(variant["digest"], dirs)
    if look is not None:
        if look.probes_known(key):
            return True  # proved in this process under watch, nothing changed since (headers.watch)
        searched = look.proof_dirs(key)  # a proof names its directories: no plan needed to check it
        if searched is not None:
            state, _safe = look.dir_state(searched)
            if look.proved(key, state):
                look.holds(key, searched, state, kept=False, links=look.proof_links(key))
                return True
    plan = _probe_plan(variant, dirs, paths)
    state, safe = look.dir_state(plan.dirs) if look is not None else ([], False)
    present = set(paths)
    links: list[Any] = []  # [place, answer] where no listing proves the answer (index.proof_links)
    for places, at in plan.probes:
        found = -1
        for i, place in enumerate(places):
            if place in present:
                found = i
                break
            if place in absent:
                continue
            here, by_listing = is_file(place)
            if not by_listing:
                links.append([place, here])
            if here:
                found = i
                break
        if found != at:
            return False
    if look is not None and len(links) <= MAX_LINKS:
        look.holds(key, plan.dirs, state, kept=safe, links=links)
    return True


# Places of one proof answered by a stat, not a listing (a symlink entry: a view of symlinks to
# the files, as Spack views, Bazel's execroot or a toolkit assembled from links make every
# header one), asked again at each use of the proof. Past this many the proof is not kept:
# checking it would cost about what proving the probes again does.
MAX_LINKS = 256


_proof_keys: dict[tuple[str, tuple[str, ...]], str] = {}


def _proof_key(variant_digest: str, dirs: Sequence[str]) -> str:
    """The name of a variant's probe proof under one search path (headers.index)."""
    memo_key = (variant_digest, tuple(dirs))
    key = _proof_keys.get(memo_key)
    if key is None:
        key = hashlib.sha256("\0".join([variant_digest, *dirs]).encode()).hexdigest()
        remember(_proof_keys, memo_key, key, 4096)
    return key


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A variant's probes under one search path: per probe the full paths to try in order and
    where it resolved; the directories they search."""

    probes: list[tuple[list[str], int]]
    dirs: list[str]


_plans: dict[tuple[str, tuple[str, ...]], _Plan] = {}
# (variant digest, search dirs) -> the path of each of its headers there (entry_paths)
_paths_memo: dict[tuple[str, tuple[str, ...]], list[str]] = {}


def _probe_plan(variant: dict[str, Any], dirs: Sequence[str], paths: list[str]) -> _Plan:
    """The variant's plan under ``dirs``; memoised per variant and search dirs (the includers'
    places follow from both, once its headers are checked)."""
    memo_key = (variant["digest"], tuple(dirs))
    plan = _plans.get(memo_key)
    if plan is None:
        first_include = variant.get("first_include", len(dirs))
        probes = []
        for where, kind, name, at in probes_of(variant):
            includer_dir = os.path.dirname(paths[where]) if where >= 0 else None
            places = includes.candidates(kind, name, includer_dir, dirs, first_include)
            probes.append(([includes.normalized(os.path.join(place, name)) for place in places], at))
        searched = sorted({os.path.dirname(place) for places, _ in probes for place in places})
        plan = _Plan(probes, searched)
        remember(_plans, memo_key, plan, 4096)
    return plan


def tracked_paths(variant: dict[str, Any], dirs: Sequence[str]) -> list[str]:
    """The absolute paths of a variant's headers under the search dirs ``dirs``."""
    known = _paths_memo.get((variant["digest"], tuple(dirs))) if "digest" in variant else None
    return list(dict.fromkeys(known if known is not None else (p for p in entry_paths(variant, dirs) if p)))


def header_paths(manifest: dict[str, Any] | None, dirs: Sequence[str]) -> list[str]:
    """Every header path any variant of ``manifest`` names (to hash before a compile)."""
    out: dict[str, None] = {}
    for variant in (manifest or {}).get("variants", ()):
        out.update(dict.fromkeys(tracked_paths(variant, dirs)))
    return list(out)
