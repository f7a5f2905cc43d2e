"""Probed header names the text hides from a plain scan: a stale hit after creating the file.

``__has_include`` through a macro (the common ``#define HAS(x) __has_include(x)`` idiom, also
defined in a header the source includes), with a comment or a line splice inside, and an
``#include`` of a name held by a macro: real NVRTC, real files; a hit after the change
must equal a compile without the cache.
"""

from __future__ import annotations

import time

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

PICK = '#if {cond}\n#define V 1\n#else\n#define V 2\n#endif\nextern "C" __global__ void k(int* p) {{ *p = V; }}\n'

CASES = {
    "macro": "#define HAS(x) __has_include(x)\n" + PICK.format(cond='HAS("opt.h")'),
    "macro_angle": "#define HAS(x) __has_include(x)\n" + PICK.format(cond="HAS(<opt.h>)"),
    "macro_in_header": '#include "has.h"\n' + PICK.format(cond='HAS("opt.h")'),
    "comment": PICK.format(cond='__has_include(/* c */ "opt.h")'),
    "splice": PICK.format(cond='__has_include( \\\n"opt.h")'),
}


def _compile(cache, code: str, options: ProgramOptions) -> tuple[bytes, bool]:
    settle_timestamps()
    info = CompileInfo()
    obj = compile_program(code, "c++", "ptx", options=options, cache=cache, info=info)
    return bytes(obj.code), info.hit


def _truth(code: str, options: ProgramOptions, monkeypatch: pytest.MonkeyPatch) -> bytes:
    with monkeypatch.context() as m:
        m.setenv("KERNELCACHE_DISABLE", "1")
        return _compile(None, code, options)[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_has_include_the_scan_cannot_read_literally(tmp_path, monkeypatch, case):
    work = tmp_path / "work"
    (work / "inc").mkdir(parents=True)
    (work / "has.h").write_text("#define HAS(x) __has_include(x)\n")
    monkeypatch.chdir(work)
    options = ProgramOptions(arch=ARCH, include_path=["inc"])
    code = CASES[case]
    with FileStreamProgramCache(str(tmp_path / "cache")) as cache:
        first, hit = _compile(cache, code, options)
        assert not hit and first == _truth(code, options, monkeypatch)
        assert _compile(cache, code, options) == (first, True)  # stored, and a hit while nothing changed
        (work / "inc" / "opt.h").write_text("\n")  # __has_include now true: V becomes 1
        time.sleep(0.05)
        after, _ = _compile(cache, code, options)
        truth = _truth(code, options, monkeypatch)
        assert truth != first
        assert after == truth


@pytest.mark.parametrize("a_h", ['#define B "b.h"\n#include B\n', '%:include "b.h"\n'], ids=["macro", "digraph"])
def test_include_shadowed_in_the_includers_directory(tmp_path, monkeypatch, a_h):
    """inc/sub/a.h includes "b.h" through a macro (`#define B "b.h"` + `#include B`) or with
    the digraph `%:` for `#`, found as inc/b.h through include_path; a new inc/sub/b.h (the
    includer's directory, searched first) must not give the old result."""
    work = tmp_path / "work"
    (work / "inc" / "sub").mkdir(parents=True)
    (work / "inc" / "sub" / "a.h").write_text(a_h)
    (work / "inc" / "b.h").write_text("#define V 1\n")
    monkeypatch.chdir(work)
    options = ProgramOptions(arch=ARCH, include_path=["inc"])
    code = '#include "sub/a.h"\nextern "C" __global__ void k(int* p) { *p = V; }\n'
    with FileStreamProgramCache(str(tmp_path / "cache")) as cache:
        first, _ = _compile(cache, code, options)
        assert _compile(cache, code, options) == (first, True)
        (work / "inc" / "sub" / "b.h").write_text("#define V 2\n")
        time.sleep(0.05)
        after, _ = _compile(cache, code, options)
        truth = _truth(code, options, monkeypatch)
        assert truth != first
        assert after == truth


def test_absolute_angle_bracket_name(tmp_path, monkeypatch):
    """`#include </abs/cfg.h>` opens that file whatever the include path: the source names a
    file, so it needs the trace (it was compiled untracked, and a hit after editing cfg.h)."""
    cfg = tmp_path / "abs" / "cfg.h"
    cfg.parent.mkdir()
    cfg.write_text("#define V 1\n")
    monkeypatch.chdir(tmp_path)
    options = ProgramOptions(arch=ARCH)
    code = f'#include <{cfg}>\nextern "C" __global__ void k(int* p) {{ *p = V; }}\n'
    with FileStreamProgramCache(str(tmp_path / "cache")) as cache:
        first, _ = _compile(cache, code, options)
        assert _compile(cache, code, options) == (first, True)
        cfg.write_text("#define V 2\n")
        time.sleep(0.05)
        after, _ = _compile(cache, code, options)
        truth = _truth(code, options, monkeypatch)
        assert truth != first
        assert after == truth


def test_a_directory_named_like_the_header_earlier_on_the_path_is_no_shadow(tmp_path, monkeypatch):
    """NVRTC passes over a directory inc1/b.h and reads inc2/b.h; the shadow check took the
    directory for a header found first, so the compile was stored and never hit again."""
    (tmp_path / "inc1" / "b.h").mkdir(parents=True)
    (tmp_path / "inc2").mkdir()
    (tmp_path / "inc2" / "b.h").write_text("#define V 1\n")
    monkeypatch.chdir(tmp_path)
    options = ProgramOptions(arch=ARCH, include_path=["inc1", "inc2"])
    code = '#include "b.h"\nextern "C" __global__ void k(int* p) { *p = V; }\n'
    with FileStreamProgramCache(str(tmp_path / "cache")) as cache:
        first, hit = _compile(cache, code, options)
        assert not hit and first == _truth(code, options, monkeypatch)
        assert _compile(cache, code, options) == (first, True)


@pytest.mark.parametrize(
    ("files", "code", "created"),
    [
        ({}, PICK.format(cond="__has_include(OPT)"), ("opt.h", "\n")),
        (
            {"sub/a.h": "#include OPT\n", "opt.h": "#define V 1\n"},
            '#include "sub/a.h"\nextern "C" __global__ void k(int* p) { *p = V; }\n',
            ("sub/opt.h", "#define V 2\n"),
        ),
    ],
    ids=["has_include", "includer_dir"],
)
def test_header_name_held_by_an_option_macro(tmp_path, monkeypatch, files, code, created):
    """define_macro=("OPT", '"opt.h"'): the name is in the options, not in any text; used by
    __has_include(OPT) or by `#include OPT` in a header, a new opt.h changes the compile."""
    work = tmp_path / "work"
    (work / "inc" / "sub").mkdir(parents=True)
    for rel, text in files.items():
        (work / "inc" / rel).write_text(text)
    monkeypatch.chdir(work)
    options = ProgramOptions(arch=ARCH, include_path=["inc"], define_macro=("OPT", '"opt.h"'))
    with FileStreamProgramCache(str(tmp_path / "cache")) as cache:
        first, _ = _compile(cache, code, options)
        assert _compile(cache, code, options) == (first, True)
        (work / "inc" / created[0]).write_text(created[1])
        time.sleep(0.05)
        after, _ = _compile(cache, code, options)
        truth = _truth(code, options, monkeypatch)
        assert truth != first
        assert after == truth
