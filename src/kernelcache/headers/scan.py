"""Which names a source asks the preprocessor to find, and where NVRTC finds them.

NVRTC's trace lists the headers a compile read, but not the names it looked for and did
not find (``__has_include("opt.h")`` false, a quoted include found on the include path and
not in the including header's own directory). A header created later under such a name
changes the compile without changing any header the trace listed. So the text of the
source and of every header it read is scanned for the names it probes (``#include`` and
``__has_include`` with a literal name); each is recorded with the place where it resolved
(or that it did not), and a look-up resolves it again.

Where a name resolves: the one rule (measured with NVRTC 13.5; tests/headers/test_resolution.py
checks each place against NVRTC itself):
- an absolute name is that path and nothing else;
- a quoted name tries its includer's directory first: for the main source, the directory of
  the program name (``options.name`` as cuda.core encodes it), joined to the working
  directory when relative, so the working directory itself for a name without one; for a
  header, the directory of the path it was read from. Then ``include_path`` in order
  (relative entries joined to the working directory, "" is the working directory). The
  working directory is searched only as one of those: a header's quoted include does not
  look in it, nor in the main source's directory;
- the -I directories are ``include_path`` and, with ``use_bundled_headers``, the bundled-headers
  root and its ``cccl`` subdirectory where their flag stands among them (cuda.core emits it
  first; a user-writable copy that NVRTC reads as it is now, so tracked like the others:
  headers.digests.bundled_roots);
- an angle-bracket name tries the -I directories only, then NVRTC's builtin headers (inside
  the library, pinned by the toolchain in the key, not tracked);
- ``--no-source-include`` drops the includer's directory from quoted names (main source and
  headers alike: search_dirs then gives "" as the main source's directory).
``#include_next`` is read as ``#include``: the header it reads is then not derived from a
probe, and is vouched for by its place under the deepest search directory holding it.
A header read by a compile is vouched for on a look-up only as the file this rule gives for
the same name from the same includer now (headers.variants: each header is recorded as the
probe that found it, and its path is derived again, from the look-up's working directory
and search path, before its content is compared), never as the path it had then.

The scan reads each text twice, as it is and with line splices joined and comments
blanked (C's translation phases 2 and 3), so ``__has_include(/* c */ "opt.h")`` is read.
A text that uses ``__has_include`` or ``#include`` with anything but a literal name (the
``#define HAS(x) __has_include(x)`` idiom, ``#include NAME``) makes every name that a
macro could be handed (a literal right after "(", or a ``#define``'s literal value) in
every text a probe. A name spelled by macro pasting is still not seen.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

from kernelcache.keys.derive import code_bytes
from kernelcache.keys.options import as_list, emits_flag

# One regex for both: "#include"/"#include_next" at the start of a line ("%:" is the
# digraph of "#"), and
# "__has_include"/"__has_include_next" anywhere (it may sit in any #if expression).
_DIRECTIVE = re.compile(
    rb'(?:^[ \t]*(?:#|%:)[ \t]*include(?:_next)?[ \t]*|(__has_include)(?:_next)?[ \t]*\([ \t]*)([<"])([^>"\r\n]+)[>"]',
    re.M,
)

# A backslash-newline splices lines before directives are recognised (trailing blanks
# allowed, as GCC and EDG do).
_SPLICE = re.compile(rb"\\[ \t\f\v]*\r?\n")

# Comments and string/character literals in one pass: a comment becomes one space (phase
# 3), a literal stays whole (a "/*" inside a string starts no comment).
# These four only directives() uses (a miss's header pass): compiled on first use (re caches
# them, flags inline), not at import, which a hit would pay for.
_LEXEMES = rb'(?s)"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|/\*.*?\*/|//[^\n]*'
_HAS_INCLUDE_WORD = rb"__has_include(?:_next)?\b"
_INCLUDE_LINE = rb"(?m)^[ \t]*(?:#|%:)[ \t]*include(?:_next)?\b"
# What a macro can hand to __has_include or #include: a literal name right after "(" (a
# macro's argument) or as a #define's value.
_MACRO_NAME = rb'(?m)(?:\(|^[ \t]*(?:#|%:)[ \t]*define[ \t]+\w+(?:\([^)\n]*\))?)[ \t]*(?:"([^"\r\n]+)"|<([^>\r\n]+)>)'

# Where a _MACRO_NAME match after "(" can start: "(" then a literal's first character.
_PAREN_LITERAL = rb'\([ \t]*["<]'


# The regexes above are tried only where a match can start (each holds a word that a fast
# substring search finds: "include", "define", or "(" before a literal), not at every byte:
# a fresh process's first header pass scans every header it read (CuPy's: about 50 ms of 70
# headers on this project's 2-core machine; 0.9 s for the corpus's 2,400 headers). Tried at
# a superset of the places a match starts, in order, skipping those inside the last match,
# they give exactly finditer's matches (tests/headers/test_scan_starts.py checks both agree).
def _matches(pattern: re.Pattern[bytes], text: bytes, starts: Sequence[int]) -> Iterator[re.Match[bytes]]:
    """``pattern.finditer(text)``'s matches, where ``starts`` (ascending) holds every place one
    can start; none of these patterns matches the empty string."""
    end = 0
    for at in starts:
        if at >= end:
            m = pattern.match(text, at)
            if m is not None:
                end = m.end()
                yield m


def _line_starts(text: bytes, word: bytes) -> list[int]:
    """The start of every line holding ``word`` (a directive's match starts there), ascending.

    Each line is searched once: the next search starts past the end of the line just found
    (one long line holding the word many times, a generated header's, is not read again from
    its start for each)."""
    out: list[int] = []
    at = text.find(word)
    while at >= 0:
        out.append(text.rfind(b"\n", 0, at) + 1)
        end = text.find(b"\n", at)
        if end < 0:
            break
        at = text.find(word, end + 1)
    return out


def _has_include_starts(text: bytes) -> list[int]:
    """Where each ``__has_include`` starts (a _DIRECTIVE match's other kind)."""
    out: list[int] = []
    at = text.find(b"__has_include")
    while at >= 0:
        out.append(at)
        at = text.find(b"__has_include", at + 13)
    return out


INCLUDE, HAS_INCLUDE = "i", "h"
_MACRO_USE, _MACRO_NAME_SEEN = "u", "m"  # directives() markers that probes() resolves


def _blanked(text: bytes) -> bytes:
    text = _SPLICE.sub(b"", text)
    return re.sub(_LEXEMES, lambda m: b" " if m.group(0)[:1] == b"/" else m.group(0), text)


def directives(text: bytes) -> list[tuple[str, str, str]]:
    """(how, kind, name) of every literal include and __has_include in ``text``, deduplicated,
    plus markers for names a macro may hand to either (turn them into probes with probes()).

    how: INCLUDE or HAS_INCLUDE; kind: "q" for "name", "a" for <name>. Directives in
    comments or inactive #if branches are found too: recording one that was not used
    can only cost a miss, never a wrong hit.
    """
    found: dict[tuple[str, str, str], None] = {}
    for variant in (text, _blanked(text)):
        literal = {INCLUDE: 0, HAS_INCLUDE: 0}
        include_lines = _line_starts(variant, b"include")
        for m in _matches(_DIRECTIVE, variant, sorted({*include_lines, *_has_include_starts(variant)})):
            how = HAS_INCLUDE if m.group(1) else INCLUDE
            literal[how] += 1
            kind = "q" if m.group(2) == b'"' else "a"
            found[(how, kind, m.group(3).decode("utf-8", "surrogateescape").strip())] = None
        if (
            len(re.findall(_HAS_INCLUDE_WORD, variant)) > literal[HAS_INCLUDE]
            or sum(1 for _ in _matches(re.compile(_INCLUDE_LINE), variant, include_lines)) > literal[INCLUDE]
        ):
            found[(_MACRO_USE, "", "")] = None
        starts = sorted({*_line_starts(variant, b"define"), *(m.start() for m in re.finditer(_PAREN_LITERAL, variant))})
        for m in _matches(re.compile(_MACRO_NAME), variant, starts):
            name = (m.group(1) if m.group(1) is not None else m.group(2)).decode("utf-8", "surrogateescape").strip()
            if name:
                found[(_MACRO_NAME_SEEN, "q" if m.group(1) is not None else "a", name)] = None
    return list(found)


def main_text(code: str | bytes, name_expressions: Sequence[str | bytes] = ()) -> bytes:
    """What the main source's probes are read from: its text, and its name expressions (each
    on a line of its own), which NVRTC compiles as C++ too and which may hold __has_include."""
    return b"\n".join([code_bytes(code), *(code_bytes(n) for n in name_expressions)])


def option_macros(options: Any) -> list[tuple[str, str, str]]:
    """directives() of the macros the options define (``define_macro``), read as #define lines.

    Such a macro can name a header (``-DCFG="cfg.h"`` with ``#include CFG``) or be a
    __has_include itself, in any text: what it names is probed from every includer.
    """
    try:
        flags = options.as_bytes("nvrtc")
    except Exception:
        return []
    lines = []
    for flag in flags:
        raw = flag if isinstance(flag, bytes) else str(flag).encode()
        if raw.startswith(b"--define-macro="):
            name, _, value = raw[len(b"--define-macro=") :].partition(b"=")
            lines.append(b"#define " + name + b" " + value + b"\n")
    return directives(b"".join(lines)) if lines else []


def probes(
    texts: dict[str | None, list[tuple[str, str, str]]], shared: Sequence[tuple[str, str, str]] = ()
) -> dict[str | None, list[tuple[str, str, str]]]:
    """The probes of each text (includer -> directives() of its text); ``shared``: the
    directives() of macros every text sees (option_macros).

    A macro defined in one text can be used in another (a header defines HAS(x), the
    source calls HAS("opt.h")), so one text with a non-literal use makes the names seen
    for macros in every text probes; as __has_include ones, whose searched places are
    checked too. Otherwise they are dropped.
    """
    macro = any(how == _MACRO_USE for found in [*texts.values(), shared] for how, _k, _n in found)
    out: dict[str | None, list[tuple[str, str, str]]] = {}
    for includer, found in texts.items():
        kept = [d for d in found if d[0] in (INCLUDE, HAS_INCLUDE)]
        if macro:
            kept += [(HAS_INCLUDE, kind, name) for how, kind, name in [*found, *shared] if how == _MACRO_NAME_SEEN]
        out[includer] = list(dict.fromkeys(kept))
    return out


def may_read_files(code: str | bytes, options: Any, name_expressions: Sequence[str | bytes] = ()) -> bool:
    """False only when this C++ source cannot make NVRTC read a file the key does not pin
    (so no trace is needed: the trace could list nothing but toolchain headers).

    ``name_expressions``: NVRTC compiles them as C++ expressions, where ``__has_include`` is
    allowed (``k<__has_include("opt.h")>``): one that names "include" is tracked too.

    Conservative: any "include" in the text (comments and strings included) that is not
    an angle-bracket name with a literal, relative spelling, any include_path or
    use_bundled_headers (angle names then search that directory), a line continuation or
    trigraph that could splice "#inc\\<newline>lude" together, and pre_include or
    extra_sources mean True. Directives cannot come out of macro expansion and _Pragma cannot
    include, so the text shows every name. Without include_path or bundled headers an
    angle-bracket name resolves only among NVRTC's builtin headers (measured: not in the
    current directory, nor that of options.name), which the toolchain in the key pins. A source
    with no "include" reads no bundled header (measured: NVRTC's trace of such a compile lists
    its builtin header alone).
    """
    for field in ("pre_include", "extra_sources", "pch", "use_pch", "pch_dir"):
        if emits_flag(field, getattr(options, field, None)):
            return True
    if any(b"include" in code_bytes(name) for name in name_expressions):
        return True
    raw = code_bytes(code)
    if b"??/" in raw or _SPLICE.search(raw) is not None:
        return True
    named = raw.count(b"include")
    if not named:
        return False
    if emits_flag("include_path", getattr(options, "include_path", None)):
        return True  # "" too: --include-path= makes NVRTC search the current directory
    if getattr(options, "use_bundled_headers", None):
        return True  # angle names search the bundled root, a copy the key does not pin (headers.digests)
    # An absolute angle-bracket name (<"/abs/cfg.h">) is opened as it is, wherever it is.
    return (
        sum(1 for m in _DIRECTIVE.finditer(raw) if m.group(2) == b"<" and not m.group(3).strip().startswith(b"/"))
        != named
    )


def pre_includes(options: Any) -> list[str]:
    """The names NVRTC pre-includes, in order (as many as it gets --pre-include flags)."""
    value = getattr(options, "pre_include", None)
    return as_list(value) if emits_flag("pre_include", value) else []


def normalized(path: str) -> str:
    """``path`` without "." parts and repeated or trailing separators, its ".." parts kept.

    NVRTC opens the path it joins, an includer's directory and the name as written (its trace
    lists "inc/sub/../val.h"), and the kernel resolves a ".." from where the part before it
    leads: through a symlink ``sub``, to the parent of the link's target. os.path.normpath
    would drop "sub/.." and name inc/val.h, another file: hashed and vouched for in place of
    the one compiled (wrong bytes once the one compiled is edited). Every header path here
    (the trace's, the probes', a variant's on a hit) goes through this one function, so they
    agree as strings; the same file reached by two spellings is two entries, which costs at
    most a stat."""
    if "/." not in path and "//" not in path and not path.startswith("./") and not path.endswith("/"):
        return path
    return _joined(path, [part for part in path.split("/") if part and part != "."])


def as_shown(paths: Sequence[str]) -> list[str]:
    """``paths`` as CompileInfo.headers lists them: a ".." after a real directory dropped with
    it (os.path.normpath's spelling), one after a symlink kept (see normalized)."""
    return list(dict.fromkeys(_shown(p) if "/.." in p else p for p in paths))


def _shown(path: str) -> str:
    out: list[str] = []
    for part in normalized(path).split("/"):
        if not part:
            continue  # the root's
        if part == ".." and out and out[-1] != ".." and not os.path.islink(_joined(path, out)):
            out.pop()
        else:
            out.append(part)
    return _joined(path, out)


def _joined(path: str, parts: list[str]) -> str:
    """``parts`` joined, absolute where ``path`` is."""
    joined = "/".join(parts)
    return "/" + joined if path.startswith("/") else joined or "."


def candidates(kind: str, name: str, includer_dir: str | None, dirs: Sequence[str], first_include: int) -> list[str]:
    """The directories NVRTC tries for ``name``, in order ([""] for an absolute name);
    ``includer_dir`` None for the main source (its directory is ``dirs[0]``)."""
    if os.path.isabs(name):
        return [""]
    if kind == "a":
        return list(dirs[first_include:])
    own = dirs[0] if includer_dir is None and dirs else includer_dir
    if dirs and not dirs[0]:
        own = None  # --no-source-include
    return ([own] if own is not None else []) + list(dirs[first_include:])


def resolve(name: str, places: Sequence[str]) -> int:
    """Index of the first place holding a file ``name``; -1 when none does."""
    for i, place in enumerate(places):
        if os.path.isfile(os.path.join(place, name) if place else name):
            return i
    return -1


def entry_path(entry: Sequence[Any], paths: Sequence[str], dirs: Sequence[str], first_include: int) -> str | None:
    """The path a header entry names under the search dirs ``dirs`` (``paths``: those of the
    entries before it); None when it names none (fewer search dirs than it was found with)."""
    if isinstance(entry[0], str):  # [kind, includer, name, place, digest]: found by that probe
        kind, where, name, at = entry[0], entry[1], entry[2], entry[3]
        includer_dir = os.path.dirname(paths[where]) if where >= 0 else None
        places = candidates(kind, name, includer_dir, dirs, first_include)
        if not 0 <= at < len(places):
            return None
        return normalized(os.path.join(places[at], name) if places[at] else name)
    index, rel = entry[0], entry[1]
    if index < 0:
        return str(rel)
    return f"{dirs[index]}{os.sep}{rel}" if index < len(dirs) and dirs[index] else None


def entry_paths(variant: dict[str, Any], dirs: Sequence[str]) -> list[str | None]:
    """The path of each header entry of ``variant`` under ``dirs``, in order: entry_path's
    answer for each (tests/headers/test_variant_records.py compares them), without building each
    entry's candidates (a hit in a fresh process derives a deep variant's 700 paths)."""
    first_include = variant.get("first_include", len(dirs))
    paths: list[str | None] = []
    tail = list(dirs[first_include:])
    no_source = bool(dirs) and not dirs[0]  # --no-source-include: no includer's directory
    includer_dirs: dict[int, str] = {}
    isabs, norm, join, dirname = os.path.isabs, normalized, os.path.join, os.path.dirname
    for entry in variant.get("headers", ()):
        kind = entry[0]
        if not isinstance(kind, str):
            paths.append(entry_path(entry, paths, dirs, first_include))  # type: ignore[arg-type]
            continue
        where, name, at = entry[1], entry[2], entry[3]
        if where >= 0:  # as entry_path: the includer's directory, whatever the kind (or its error)
            own = includer_dirs.get(where)
            if own is None:
                own = includer_dirs[where] = dirname(paths[where])  # type: ignore[type-var]
        else:
            own = dirs[0] if dirs else None
        if isabs(name):
            paths.append(norm(name) if at == 0 else None)
            continue
        if kind == "a":
            place = tail[at] if 0 <= at < len(tail) else None
        else:
            if own is not None and not no_source:
                place = own if at == 0 else (tail[at - 1] if 0 < at <= len(tail) else None)
            else:
                place = tail[at] if 0 <= at < len(tail) else None
        if place is None:
            paths.append(None)
        else:
            paths.append(norm(join(place, name) if place else name))
    return paths
