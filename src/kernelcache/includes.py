"""Which names a source asks the preprocessor to find, and where NVRTC finds them.

NVRTC's trace lists the headers a compile read, but not the names it looked for and did
not find (``__has_include("opt.h")`` false, a quoted include found on the include path and
not in the including header's own directory). A header created later under such a name
changes the compile without changing any header the trace listed. So the text of the
source and of every header it read is scanned for the names it probes (``#include`` and
``__has_include`` with a literal name); each is recorded with the place where it resolved
(or that it did not), and a look-up resolves it again.

NVRTC's search order (measured with NVRTC 13.5): a quoted name from the main source tries
the directory of ``options.name``, the current directory, then ``include_path``; from a
header, that header's own directory first; an angle-bracket name tries ``include_path``
only (then NVRTC's builtin and bundled headers, pinned by the toolchain in the key). An
absolute name is just that path.

Names computed by macros (``#include MACRO``, ``__has_include(MACRO)``) cannot be read
from the text: the headers they found are still covered by the trace and the shadow rule
in headers.py, but an absent one is not.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

# One regex for both: "#include"/"#include_next" at the start of a line, and
# "__has_include"/"__has_include_next" anywhere (it may sit in any #if expression).
_DIRECTIVE = re.compile(
    rb'(?:^[ \t]*#[ \t]*include(?:_next)?[ \t]*|(__has_include)(?:_next)?[ \t]*\([ \t]*)([<"])([^>"\r\n]+)[>"]',
    re.M,
)

# A backslash-newline splices lines before directives are recognised (trailing blanks
# allowed, as GCC and EDG do).
_SPLICE = re.compile(rb"\\[ \t\f\v]*\r?\n")

INCLUDE, HAS_INCLUDE = "i", "h"


def directives(text: bytes) -> list[tuple[str, str, str]]:
    """(how, kind, name) of every literal include and __has_include in ``text``, deduplicated.

    how: INCLUDE or HAS_INCLUDE; kind: "q" for "name", "a" for <name>. Directives in
    comments or inactive #if branches are found too: recording one that was not used
    can only cost a miss, never a wrong hit.
    """
    found: dict[tuple[str, str, str], None] = {}
    for m in _DIRECTIVE.finditer(text):
        how = HAS_INCLUDE if m.group(1) else INCLUDE
        kind = "q" if m.group(2) == b'"' else "a"
        found[(how, kind, m.group(3).decode("utf-8", "surrogateescape").strip())] = None
    return list(found)


def may_read_files(code: str | bytes, options: Any) -> bool:
    """False only when this C++ source cannot make NVRTC read a file the key does not pin
    (so no trace is needed: the trace could list nothing but toolchain headers).

    Conservative: any "include" in the text (comments and strings included) that is not
    an angle-bracket name with a literal spelling, any include_path (angle names then
    search it), a line continuation or trigraph that could splice "#inc\\<newline>lude"
    together, and pre_include or extra_sources mean True. Directives cannot come out of
    macro expansion and _Pragma cannot include, so the text shows every name. Without
    include_path an angle-bracket name resolves only among NVRTC's builtin and bundled
    headers (measured: not in the current directory, nor that of options.name), which the
    toolchain in the key pins, as it does when they are traced.
    """
    for field in ("pre_include", "extra_sources", "pch", "use_pch", "pch_dir"):
        if _is_set(getattr(options, field, None)):
            return True
    raw = code.encode("utf-8", "surrogatepass") if isinstance(code, str) else bytes(code)
    if b"??/" in raw or _SPLICE.search(raw) is not None:
        return True
    named = raw.count(b"include")
    if not named:
        return False
    if _is_set(getattr(options, "include_path", None)):
        return True
    return sum(1 for m in _DIRECTIVE.finditer(raw) if m.group(2) == b"<") != named


def _is_set(value: Any) -> bool:
    return value not in (None, "", [], (), False)


def pre_includes(options: Any) -> list[str]:
    value = getattr(options, "pre_include", None)
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def candidates(kind: str, name: str, includer_dir: str | None, dirs: Sequence[str], first_include: int) -> list[str]:
    """The directories NVRTC tries for ``name``, in order ([""] for an absolute name)."""
    if os.path.isabs(name):
        return [""]
    if kind == "a":
        return list(dirs[first_include:])
    return ([includer_dir] if includer_dir is not None else []) + list(dirs)


def resolve(name: str, places: Sequence[str]) -> int:
    """Index of the first place holding a file ``name``; -1 when none does."""
    for i, place in enumerate(places):
        if os.path.isfile(os.path.join(place, name) if place else name):
            return i
    return -1
