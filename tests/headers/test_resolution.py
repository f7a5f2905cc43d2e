"""A header is vouched for only as the file the current compile would read: the same name from
the same includer, resolved from this call's working directory and search path (headers.scan
states the rule). Two checkouts, one process that changes directory, and KERNELCACHE_BASE_DIR
each get the bytes of their own headers, every time, with real files and real processes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, InMemoryProgramCache, KernelCacheWarning, compile_program

RELATIVE = '#include "../shared/x.h"\nextern "C" __global__ void k(int* o) { o[0] = XV; }\n'

_CHILD = r"""
import hashlib, sys, warnings
warnings.simplefilter("ignore")
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
root, arch, code = sys.argv[1], sys.argv[2], sys.argv[3]
include = sys.argv[4:] or None
info = CompileInfo()
obj = compile_program(code, target_type="ptx", cache=FileStreamProgramCache(root), info=info,
                      options=ProgramOptions(arch=arch, include_path=include))
print(info.hit, hashlib.sha256(bytes(obj.code)).hexdigest())
"""


def _child(root: str, cwd: str, code: str, include: list[str] = (), **env: str) -> tuple[bool, str]:
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(os.path.abspath(p) for p in sys.path if p), **env}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, root, ARCH, code, *include],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    hit, digest = proc.stdout.split()
    return hit == "True", digest


def _checkouts(tmp_path, layout: dict[str, str]) -> list[str]:
    """Two checkouts with the same files, but XV 100 in the first and 200 in the second."""
    roots = []
    for n, value in (("ck1", "100"), ("ck2", "200")):
        for rel, text in layout.items():
            path = tmp_path / n / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.replace("XVALUE", value))
        roots.append(str(tmp_path / n))
    settle_timestamps()
    return roots


def test_two_checkouts_with_a_relative_include_through_the_working_directory(tmp_path) -> None:
    ck1, ck2 = _checkouts(tmp_path, {"proj/.keep": "", "shared/x.h": "#define XV XVALUE\n"})
    root = str(tmp_path / "cache")
    truth = {ck: _child(root, f"{ck}/proj", RELATIVE, KERNELCACHE_DISABLE="1")[1] for ck in (ck1, ck2)}
    assert truth[ck1] != truth[ck2]
    runs = [(ck, _child(root, f"{ck}/proj", RELATIVE)) for ck in (ck1, ck2, ck1, ck2)]
    assert [digest == truth[ck] for ck, (_, digest) in runs] == [True] * 4
    assert [hit for _, (hit, _) in runs] == [False, False, True, True]


def test_two_checkouts_under_one_base_dir_whose_header_climbs_out_of_the_include_path(tmp_path) -> None:
    # base/inc/sub/h.h includes "../../shared/x.h": base/shared/x.h, outside every search dir.
    layout = {
        "base/inc/sub/h.h": '#include "../../shared/x.h"\n',
        "base/shared/x.h": "#define XV XVALUE\n",
        "run/.keep": "",
    }
    ck1, ck2 = _checkouts(tmp_path, layout)
    code = '#include "sub/h.h"\nextern "C" __global__ void k(int* o) { o[0] = XV; }\n'
    root = str(tmp_path / "cache")

    def run(ck: str, **env: str) -> tuple[bool, str]:
        return _child(root, f"{ck}/run", code, [f"{ck}/base/inc"], KERNELCACHE_BASE_DIR=f"{ck}/base", **env)

    truth = {ck: run(ck, KERNELCACHE_DISABLE="1")[1] for ck in (ck1, ck2)}
    assert truth[ck1] != truth[ck2]
    runs = [(ck, run(ck)) for ck in (ck1, ck2, ck1, ck2)]
    assert [digest == truth[ck] for ck, (_, digest) in runs] == [True] * 4
    assert [hit for _, (hit, _) in runs] == [False, False, True, True]


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_one_process_changing_directory_between_compiles(tmp_path, monkeypatch, store: str) -> None:
    ck1, ck2 = _checkouts(tmp_path, {"proj/.keep": "", "shared/x.h": "#define XV XVALUE\n"})
    cache = InMemoryProgramCache() if store == "memory" else FileStreamProgramCache(tmp_path / "cache")
    seen = []
    for ck in (ck1, ck2, ck1, ck2):
        monkeypatch.chdir(f"{ck}/proj")
        info = CompileInfo()
        obj = compile_program(RELATIVE, target_type="ptx", cache=cache, options=ProgramOptions(arch=ARCH), info=info)
        seen.append((info.hit, b"100" in bytes(obj.code), info.headers))
    assert seen == [
        (False, True, [f"{ck1}/shared/x.h"]),
        (False, False, [f"{ck2}/shared/x.h"]),
        (True, True, [f"{ck1}/shared/x.h"]),
        (True, False, [f"{ck2}/shared/x.h"]),
    ]


# Every place a quoted or angle-bracket name resolves from, each checked against NVRTC itself:
# the main source's directory (the working directory, or that of a program name with one), the
# including header's own directory, include_path in order (relative entries too); and the places
# NVRTC does not search (the working directory for a header's include, for an angle name).
_PLACES = {
    # case: (files, code, program name, include_path, the file whose edit must change the bytes)
    "cwd": ({"w.h": "#define V 1\n"}, '#include "w.h"', None, None, "w.h"),
    "name-dir": ({"sub/n.h": "#define V 1\n", "n.h": "#define V 9\n"}, '#include "n.h"', "sub/k.cu", None, "sub/n.h"),
    "includer-dir": (
        {"inc/a.h": '#include "b.h"\n', "inc/b.h": "#define V 1\n", "b.h": "#define V 9\n"},
        '#include "a.h"',
        None,
        ["inc"],
        "inc/b.h",
    ),
    "include-order": (
        {"i1/o.h": "#define V 1\n", "i2/o.h": "#define V 9\n"},
        "#include <o.h>",
        None,
        ["i1", "i2"],
        "i1/o.h",
    ),
    "header-skips-cwd": (
        {"inc/a.h": '#include "c.h"\n', "c.h": "#define V 9\n", "i2/c.h": "#define V 1\n"},
        '#include "a.h"',
        None,
        ["inc", "i2"],
        "i2/c.h",
    ),
    "angle-skips-cwd": ({"d.h": "#define V 9\n", "i1/d.h": "#define V 1\n"}, "#include <d.h>", None, ["i1"], "i1/d.h"),
}


@pytest.mark.parametrize("case", sorted(_PLACES))
def test_each_place_a_name_resolves_from(tmp_path, monkeypatch, case: str) -> None:
    files, include, name, include_path, edited = _PLACES[case]
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.chdir(tmp_path)
    code = include + '\nextern "C" __global__ void k(int* o) { o[0] = V; }\n'
    options = ProgramOptions(arch=ARCH, name=name, include_path=include_path)
    cache = FileStreamProgramCache(tmp_path / "cache")

    def compiled() -> tuple[bool, bytes, list[str]]:
        settle_timestamps()
        info = CompileInfo()
        obj = compile_program(code, target_type="ptx", cache=cache, options=options, info=info)
        return info.hit, bytes(obj.code), info.headers

    first = compiled()
    assert not first[0] and str(tmp_path / edited) in first[2]
    assert compiled()[0]
    (tmp_path / edited).write_text("#define V 5\n")
    hit, code_bytes, _ = compiled()
    assert not hit and hashlib.sha256(code_bytes).digest() != hashlib.sha256(first[1]).digest()


def test_a_directory_change_during_the_compile_is_not_stored(tmp_path, monkeypatch) -> None:
    # Race: NVRTC resolves quoted includes against the directory current when it opens them,
    # and the header pass runs after the compile. The moment NVRTC has read one, another
    # thread changes directory: what the two passes read cannot be vouched for.
    import threading

    import _fswatch

    ck1, ck2 = _checkouts(tmp_path, {"proj/.keep": "", "shared/x.h": "#define XV XVALUE\n"})
    slow = RELATIVE.replace(
        "o[0] = XV;",
        "float x = o[1];\n#pragma unroll\nfor (int i = 0; i < 40; ++i) x = sinf(x * 1.0001f + i) * cosf(x - i);\no[0] = XV + (int)x;",
    )
    monkeypatch.chdir(f"{ck1}/proj")
    watch = _fswatch.Watch()
    watch.add(f"{ck1}/shared/x.h", _fswatch.IN_CLOSE_NOWRITE)
    moved = threading.Event()

    def move_once_read() -> None:
        if watch.events(120):
            os.chdir(f"{ck2}/proj")
            moved.set()

    mover = threading.Thread(target=move_once_read)
    mover.start()
    info = CompileInfo()
    try:
        with pytest.warns(KernelCacheWarning, match="working directory changed"):
            compile_program(
                slow,
                target_type="ptx",
                cache=FileStreamProgramCache(tmp_path / "cache"),
                options=ProgramOptions(arch=ARCH),
                info=info,
            )
    finally:
        mover.join(130)
        watch.close()
    assert moved.is_set() and not info.cached
