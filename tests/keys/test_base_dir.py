"""KERNELCACHE_BASE_DIR: two checkouts of one project share entries, never a stale or wrong one.

Every compile runs in a fresh process inside its own checkout (real directories, real NVRTC
compiles, one shared cache directory), as two clones of a repository would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cuda.core import ProgramOptions
from helpers import run_python, settle_timestamps

import kernelcache
from kernelcache import config
from kernelcache.cli.entries import is_manifest
from kernelcache.keys import basedir

SOURCE = '#include "conf.h"\nextern "C" __global__ void k(float* x) { x[0] = SCALE; }'
# A header whose path ends up in the artifact (as assert's message does).
FILE_SOURCE = '#include "where.h"\nextern "C" __global__ void w() { printf("%s\\n", where()); }'
CHILD = r"""
import hashlib, json, os, sys, warnings
from cuda.core import ProgramOptions
import kernelcache
src, target, inc = sys.argv[1], sys.argv[2], sys.argv[3]
cache = kernelcache.FileStreamProgramCache(os.environ["SHARED_CACHE"])
info = kernelcache.CompileInfo()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    obj = kernelcache.compile_program(src, target_type=target, cache=cache, info=info,
        options=ProgramOptions(arch="sm_90", include_path=[inc], name=os.path.join(os.getcwd(), "k.cu")))
print(json.dumps({"hit": info.hit, "key": info.key_hex, "headers": info.headers, "cached": info.cached,
                  "sha256": hashlib.sha256(bytes(obj.code)).hexdigest(),
                  "warnings": [str(w.message) for w in caught]}))
"""


def _checkout(root: Path, scale: str = "2.0f") -> Path:
    (root / "include").mkdir(parents=True)
    (root / "include" / "conf.h").write_text(f"#define SCALE {scale}\n")
    (root / "include" / "where.h").write_text("__device__ const char* where() { return __FILE__; }\n")
    return root


def _compile(checkout: Path, cache: Path, base: Path | None, src: str = SOURCE, target: str = "cubin") -> dict:
    settle_timestamps()
    env = {"SHARED_CACHE": str(cache), "KERNELCACHE_BASE_DIR": str(base) if base else ""}
    cwd = os.getcwd()
    os.chdir(checkout)  # the child runs in its checkout, like a build would
    try:
        return json.loads(run_python(CHILD, src, target, str(checkout / "include"), env=env))
    finally:
        os.chdir(cwd)


def _artifacts(cache: Path) -> int:
    with kernelcache.FileStreamProgramCache(cache) as store:
        return sum(1 for e in store.iter_entries() if not is_manifest(e))  # artifacts, not bookkeeping


def test_two_checkouts_share_one_entry_and_an_edited_header_is_a_miss(tmp_path):
    a, b, cache = _checkout(tmp_path / "a" / "proj"), _checkout(tmp_path / "b" / "proj"), tmp_path / "kc"
    first = _compile(a, cache, a)
    second = _compile(b, cache, b)
    assert not first["hit"] and second["hit"] and first["key"] == second["key"]
    assert second["sha256"] == first["sha256"] and _artifacts(cache) == 1
    assert second["headers"] == [str(b / "include" / "conf.h")]  # tracked where it is read now
    (b / "include" / "conf.h").write_text("#define SCALE 3.0f\n")
    edited = _compile(b, cache, b)
    assert not edited["hit"] and edited["sha256"] != first["sha256"]
    assert _compile(a, cache, a)["hit"] and _artifacts(cache) == 2
    assert _compile(b, cache, b)["hit"]


def test_without_a_base_dir_the_checkouts_do_not_share(tmp_path):
    a, b, cache = _checkout(tmp_path / "a" / "proj"), _checkout(tmp_path / "b" / "proj"), tmp_path / "kc"
    assert not _compile(a, cache, None)["hit"]
    assert not _compile(b, cache, None)["hit"] and _artifacts(cache) == 2


def test_a_path_outside_the_base_dir_keys_as_before(tmp_path):
    a, cache = _checkout(tmp_path / "a" / "proj"), tmp_path / "kc"
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    plain = _compile(a, cache, None)
    assert _compile(a, tmp_path / "kc2", elsewhere)["key"] == plain["key"]


@pytest.mark.parametrize("target", ["cubin", "ptx"])
def test_an_artifact_that_names_its_checkout_is_not_shared(tmp_path, target):
    # __FILE__ puts /x/a/proj/include/where.h into the kernel: served to /x/b/proj it would
    # not be what a compile there gives. Returned, not stored, one warning; never a wrong hit.
    a, b, cache = _checkout(tmp_path / "a" / "proj"), _checkout(tmp_path / "b" / "proj"), tmp_path / "kc"
    first = _compile(a, cache, a, FILE_SOURCE, target)
    assert not first["hit"] and not first["cached"]
    assert len(first["warnings"]) == 1 and "KERNELCACHE_BASE_DIR" in first["warnings"][0]
    second = _compile(b, cache, b, FILE_SOURCE, target)
    assert not second["hit"] and second["sha256"] != first["sha256"]
    assert _artifacts(cache) == 0


def test_the_key_does_not_depend_on_home_cwd_temp_or_cache_dir(tmp_path):
    # The audit: none of these is an input of the compile, so none may change the key.
    code = (
        "import os, sys, kernelcache\n"
        "from cuda.core import ProgramOptions\n"
        "os.chdir(sys.argv[1])\n"
        "info = kernelcache.CompileInfo()\n"
        "kernelcache.compile_program('#include \"a.h\"\\nextern \"C\" __global__ void q() { A; }', info=info,\n"
        "    options=ProgramOptions(arch='sm_90'))\n"
        "print(info.key_hex)\n"
    )
    keys = set()
    for i in range(2):
        place = tmp_path / f"place{i}"
        for sub in ("home", "tmp", "cwd", "kc"):
            (place / sub).mkdir(parents=True)
        (place / "cwd" / "a.h").write_text("#define A (void)0\n")  # found through the current directory
        env = {"HOME": str(place / "home"), "TMPDIR": str(place / "tmp"), "KERNELCACHE_DIR": str(place / "kc")}
        settle_timestamps()
        keys.add(run_python(code, str(place / "cwd"), env=env).strip())
    assert len(keys) == 1 and "" not in keys


def test_the_variable_is_checked(monkeypatch):
    for bad in ("relative/src", "/", "//"):
        monkeypatch.setenv("KERNELCACHE_BASE_DIR", bad)
        with pytest.raises(config.ConfigError, match="KERNELCACHE_BASE_DIR"):
            config.base_dir()
    monkeypatch.setenv("KERNELCACHE_BASE_DIR", "/home/alice/src/")
    assert config.base_dir() == "/home/alice/src" == basedir.current()


def test_rebased_options_leave_the_callers_alone_and_mark_what_they_rebase():
    opts = ProgramOptions(arch="sm_90", include_path=["/w/proj/inc", "/usr/include", "rel"], name="/w/proj/k.cu")
    keyed = basedir.key_options(opts, "c++", "cubin", "/w/proj")
    assert opts.include_path == ["/w/proj/inc", "/usr/include", "rel"] and opts.name == "/w/proj/k.cu"
    assert keyed.include_path[1:] == ["/usr/include", "rel"] and keyed.include_path[0].endswith("inc")
    assert keyed.include_path[0] != "inc" and keyed.name != "k.cu"  # never equal to a literal relative path
    assert basedir.key_options(opts, "c++", "ltoir", "/w/proj") is opts
    assert basedir.key_options(opts, "c++", "cubin", "/w/projects") is opts  # a prefix is not a parent
