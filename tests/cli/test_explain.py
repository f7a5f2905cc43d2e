"""``kernelcache explain``: a key prefix as ls, the demo and a miss's reason print it, or the
call's arguments (a manifest or a lockfile line); exit 1 when the request is not in the
cache (usable in CI); and the differences it names are differences in the key."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from helpers import ARCH

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

SRC = 'extern "C" __global__ void k(float* a) { a[0] = N; }'


def _kc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, timeout=300, env=os.environ
    )


def _cached(tmp_path) -> tuple[str, CompileInfo]:
    from cuda.core import ProgramOptions

    cache = str(tmp_path / "c")
    info = CompileInfo()
    compile_program(
        SRC, options=ProgramOptions(arch=ARCH, define_macro=("N", "4")), cache=FileStreamProgramCache(cache), info=info
    )
    return cache, info


def test_explain_takes_the_key_prefix_ls_and_a_miss_print(tmp_path) -> None:
    cache, info = _cached(tmp_path)
    listed = json.loads(_kc("ls", "--json", "--cache-dir", cache).stdout)
    prefix = listed[0]["key"][:16]
    assert prefix == info.entry_name[:16]
    found = _kc("explain", prefix, "--cache-dir", cache, "--json")
    assert found.returncode == 0, found.stdout + found.stderr
    result = json.loads(found.stdout)
    assert result["in_cache"] is True and result["key"] == info.entry_name
    assert result["entry"]["kernels"] == ["k"] and result["entry"]["code_type"] == "c++"
    text = _kc("explain", prefix, "--cache-dir", cache)
    assert text.returncode == 0 and text.stdout.startswith(f"key {prefix}: in the cache")
    absent = _kc("explain", "0123456789abcdef", "--cache-dir", cache)
    assert absent.returncode == 1, absent.stdout + absent.stderr
    assert "NOT in the cache" in absent.stdout and "Traceback" not in absent.stderr


def test_explain_of_a_request_not_in_the_cache_exits_1_and_names_what_differs(tmp_path) -> None:
    cache, info = _cached(tmp_path)
    same = tmp_path / "same.json"
    kernel = {"name": "k", "code": SRC, "arch": ARCH, "options": {"define_macro": "N=4"}}
    same.write_text(json.dumps({"kernel": [kernel]}))
    hit = _kc("explain", str(same), "--cache-dir", cache, "--json")
    assert hit.returncode == 0, hit.stdout + hit.stderr  # ("N", "4") and "N=4": one key, in the cache
    assert json.loads(hit.stdout)["key"] == info.entry_name
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"kernel": [{**kernel, "options": {"define_macro": "N=5"}}]}))
    miss = _kc("explain", str(other), "--cache-dir", cache, "--json")
    assert miss.returncode == 1, miss.stdout + miss.stderr
    result = json.loads(miss.stdout)
    assert result["in_cache"] is False and result["closest"] == info.entry_name[:16]
    assert result["differences"] == {"options.define_macro": ["['N=4']", "['N=5']"]}
    assert "NOT in the cache" in _kc("explain", str(other), "--cache-dir", cache).stdout


def test_two_descriptions_with_one_key_have_no_difference(tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    kernel = {"name": "k", "code": SRC, "arch": ARCH}
    a.write_text(json.dumps({"kernel": [{**kernel, "options": {"define_macro": [["N", "4"]]}}]}))
    b.write_text(json.dumps({"kernel": [{**kernel, "options": {"define_macro": "N=4"}}]}))
    out = _kc("explain", str(a), str(b), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["differences"] == {} and result["source_key"] == result["other_source_key"]
