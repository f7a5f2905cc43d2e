"""scan.directives tries its regexes only where a match can start (scan._matches); what it finds
must be exactly what the plain scan finds, trying them at every byte: on real headers (NVRTC's
bundled CCCL and CUDA headers, the vendored CuPy kernels) and on random texts made of the
pieces the patterns care about (line starts, "#", "%:", include, define, literals, comments,
splices)."""

from __future__ import annotations

import os
import random
import re

import pytest

from kernelcache.headers import scan

HERE = os.path.dirname(os.path.abspath(__file__))
VENDORED = os.path.join(HERE, "..", "..", "benchmarks", "kernels")


def plain_directives(text: bytes) -> list[tuple[str, str, str]]:
    """directives() as the plain scan gives it: each regex's finditer over the whole text."""
    found: dict[tuple[str, str, str], None] = {}
    for variant in (text, scan._blanked(text)):
        literal = {scan.INCLUDE: 0, scan.HAS_INCLUDE: 0}
        for m in scan._DIRECTIVE.finditer(variant):
            how = scan.HAS_INCLUDE if m.group(1) else scan.INCLUDE
            literal[how] += 1
            kind = "q" if m.group(2) == b'"' else "a"
            found[(how, kind, m.group(3).decode("utf-8", "surrogateescape").strip())] = None
        if (
            len(re.findall(scan._HAS_INCLUDE_WORD, variant)) > literal[scan.HAS_INCLUDE]
            or len(re.findall(scan._INCLUDE_LINE, variant)) > literal[scan.INCLUDE]
        ):
            found[(scan._MACRO_USE, "", "")] = None
        for m in re.finditer(scan._MACRO_NAME, variant):
            name = (m.group(1) if m.group(1) is not None else m.group(2)).decode("utf-8", "surrogateescape").strip()
            if name:
                found[(scan._MACRO_NAME_SEEN, "q" if m.group(1) is not None else "a", name)] = None
    return list(found)


def _texts_under(top: str) -> list[tuple[str, bytes]]:
    out = []
    for folder, _, files in os.walk(top):
        for name in sorted(files):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out.append((path, f.read()))
    return out


@pytest.fixture(scope="module")
def real_headers(tmp_path_factory) -> list[tuple[str, bytes]]:
    texts = _texts_under(VENDORED)
    try:
        from cuda.bindings import nvrtc

        where = str(tmp_path_factory.mktemp("bundled"))
        if nvrtc.nvrtcInstallBundledHeaders(os.fsencode(where), 0)[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            texts += _texts_under(where)
    except (ImportError, AttributeError):
        pass  # an NVRTC without bundled headers: the vendored kernels alone
    return texts


def test_real_headers_give_what_the_plain_scan_gives(real_headers) -> None:
    assert len(real_headers) > 40
    differing = [path for path, text in real_headers if scan.directives(text) != plain_directives(text)]
    assert differing == []


_PIECES = [
    b"\n", b"\r\n", b" ", b"\t", b"#", b"%:", b"include", b"include_next", b"__has_include", b"_next",
    b"define", b"#define X ", b"#define F(a) ", b"(", b")", b'"', b"<", b">", b"a.h", b"b/c.h", b"/*", b"*/",
    b"//", b"\\\n", b"'", b"x", b"#include ", b'#include "q.h"', b"#include <a.h>", b'__has_include("h.h")',
    b"( <w.h>", b'("m.h")', b"\\", b"#  include", b"%:include",
]  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_random_texts_give_what_the_plain_scan_gives(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(1500):
        text = b"".join(rng.choice(_PIECES) for _ in range(rng.randrange(1, 40)))
        assert scan.directives(text) == plain_directives(text), text


def test_a_generated_header_with_long_lines_gives_what_the_plain_scan_gives() -> None:
    """Lines that hold the words many times (a generated header's table, a minified blob), next
    to directives: each line is searched once, and what is found is the plain scan's."""
    blob = b'static const char* t = "' + b'#include <x.h> __has_include("y.h") (<z.h>) define ' * 2000 + b'";\n'
    text = b'#include "a.h"\n' + blob + b'#define CFG "cfg.h" define\n%:include <b.h>\n' + blob[:-1]
    assert scan.directives(text) == plain_directives(text)
