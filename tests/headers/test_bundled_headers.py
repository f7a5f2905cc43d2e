"""NVRTC's bundled headers (``use_bundled_headers=True``) are tracked like any other search
directory's: NVRTC reads the installed copy as it is now (a plain, user-writable directory),
so an edit there is a miss whose bytes are those of a plain compile, and an unchanged copy is
a hit in a fresh process. Real NVRTC, real files, fresh processes; the bundled-headers
directory is a private one (cuda.core puts it under ``XDG_CACHE_HOME``), never the user's."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import run_python, settle_timestamps
from sources import needs_bundled_headers

pytestmark = needs_bundled_headers

CODE = """#include <cuComplex.h>
#ifndef KC_BUNDLED_VALUE
#define KC_BUNDLED_VALUE 1
#endif
extern "C" __global__ void k(int* o) { o[0] = KC_BUNDLED_VALUE; }
"""

# One child per step: compile through the cache (or plainly, with cuda.core alone) and print
# what happened and the SHA-256 of the code.
CHILD = """
import hashlib, json, sys
from cuda.core import Program, ProgramOptions
from helpers import ARCH
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
code, cache_dir, mode = sys.argv[1], sys.argv[2], sys.argv[3]
options = ProgramOptions(arch=ARCH, use_bundled_headers=True, include_path=sys.argv[4:] or None)
root = options.as_bytes("nvrtc")[1].decode().split("=", 1)[1]
if mode == "plain":
    out = Program(code, "c++", options=options).compile("cubin")
    print(json.dumps({"sha": hashlib.sha256(bytes(out.code)).hexdigest(), "root": root}))
else:
    info = CompileInfo()
    out = compile_program(code, cache=FileStreamProgramCache(cache_dir), options=options, info=info)
    print(json.dumps({"sha": hashlib.sha256(bytes(out.code)).hexdigest(), "hit": info.hit,
                      "cached": info.cached, "headers": list(info.headers), "root": root}))
"""


def child(tmp_path, xdg: str, mode: str, code: str = CODE, include: tuple[str, ...] = ()) -> dict:
    helpers_dir = os.path.dirname(os.path.abspath(__import__("helpers").__file__))
    env = {"XDG_CACHE_HOME": xdg, "PYTHONPATH": os.pathsep.join([helpers_dir, os.environ.get("PYTHONPATH", "")])}
    return json.loads(run_python(CHILD, code, str(tmp_path / "cache"), mode, *include, env=env).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> str:
    """An XDG_CACHE_HOME whose bundled headers NVRTC installed (by one plain compile)."""
    xdg = tmp_path_factory.mktemp("xdg-installed")
    first = child(tmp_path_factory.mktemp("plain"), str(xdg), "plain")
    assert first["root"].startswith(str(xdg)), first  # the private copy, never the user's
    assert os.path.isfile(os.path.join(first["root"], "cuComplex.h"))
    return str(xdg)


def private_copy(installed: str, tmp_path) -> tuple[str, str]:
    """(an XDG_CACHE_HOME of this test's own, the cuComplex.h in it)."""
    xdg = tmp_path / "xdg"
    shutil.copytree(installed, xdg, symlinks=True)
    found = [os.path.join(d, "cuComplex.h") for d, _, files in os.walk(xdg) if "cuComplex.h" in files]
    assert len(found) == 1, found
    return str(xdg), found[0]


def test_an_edited_bundled_header_is_a_miss_with_the_plain_compiles_bytes(installed, tmp_path) -> None:
    xdg, header = private_copy(installed, tmp_path)
    settle_timestamps()
    stored = child(tmp_path, xdg, "cached")
    assert (stored["hit"], stored["cached"]) == (False, True)
    with open(header, "a") as f:
        f.write("\n#define KC_BUNDLED_VALUE 2\n")
    settle_timestamps()
    plain = child(tmp_path, xdg, "plain")
    assert plain["sha"] != stored["sha"]  # the edit changes what NVRTC makes
    again = child(tmp_path, xdg, "cached")
    assert (again["hit"], again["sha"]) == (False, plain["sha"])
    assert header in stored["headers"]  # the bundled header is one the entry vouches for


def test_unchanged_bundled_headers_hit_in_a_fresh_process(installed, tmp_path) -> None:
    xdg, header = private_copy(installed, tmp_path)
    settle_timestamps()
    stored = child(tmp_path, xdg, "cached")
    again = child(tmp_path, xdg, "cached")
    assert (stored["hit"], stored["cached"], again["hit"]) == (False, True, True)
    assert again["sha"] == stored["sha"] and header in again["headers"]


def test_a_bundled_header_copy_elsewhere_still_hits(installed, tmp_path) -> None:
    """Keys name bundled headers by their place under the bundled root, not by the home
    directory: the same copy at another XDG_CACHE_HOME (another user's) hits the entry."""
    xdg, _ = private_copy(installed, tmp_path)
    settle_timestamps()
    stored = child(tmp_path, xdg, "cached")
    other = tmp_path / "other-user"
    shutil.copytree(xdg, other, symlinks=True)
    settle_timestamps()
    again = child(tmp_path, str(other), "cached")
    assert (stored["cached"], again["hit"], again["sha"]) == (True, True, stored["sha"])
    assert not any(h.startswith(xdg + os.sep) for h in again["headers"])


@pytest.mark.parametrize("kind", ["<>", '""'])
def test_a_header_added_to_the_bundled_cccl_dir_shadows_include_path(installed, tmp_path, kind: str) -> None:
    """NVRTC searches the bundled root's cccl subdirectory before include_path (for both kinds
    of name): a header found on include_path and then shadowed by a new file there is a miss
    with the plain compile's bytes."""
    xdg, header = private_copy(installed, tmp_path)
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "kc_shadow.h").write_text("#define KC_BUNDLED_VALUE 3\n")
    code = CODE.replace("<cuComplex.h>", kind[0] + "kc_shadow.h" + kind[1])
    settle_timestamps()
    stored = child(tmp_path, xdg, "cached", code, (str(inc),))
    assert (stored["hit"], stored["cached"]) == (False, True)
    with open(os.path.join(os.path.dirname(header), "cccl", "kc_shadow.h"), "w") as f:
        f.write("#define KC_BUNDLED_VALUE 4\n")
    settle_timestamps()
    plain = child(tmp_path, xdg, "plain", code, (str(inc),))
    assert plain["sha"] != stored["sha"]  # NVRTC now reads the cccl copy
    again = child(tmp_path, xdg, "cached", code, (str(inc),))
    assert (again["hit"], again["sha"]) == (False, plain["sha"])


def test_the_compile_that_installs_the_bundled_headers_is_stored(tmp_path) -> None:
    """A first compile in a home without the bundled headers (NVRTC would install them during
    the compile, stamping them after its start) is stored, and a fresh process hits it."""
    xdg = str(tmp_path / "fresh-xdg")
    stored = child(tmp_path, xdg, "cached")
    assert os.path.isfile(os.path.join(stored["root"], ".nvrtc_headers_version"))
    again = child(tmp_path, xdg, "cached")
    assert (stored["hit"], stored["cached"], again["hit"], again["sha"]) == (False, True, True, stored["sha"])
