"""The command line's rough edges, each through the real `kernelcache` command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from helpers import REPO

from kernelcache.stores.file.store import FileStreamProgramCache

ROOT = REPO
EXAMPLE = os.path.join(ROOT, "examples", "warm.toml")
BAD_KERNEL = 'extern "C" __global__ void bad() { int x = ; undefined_a(); undefined_b(); }'


def kc(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory) -> str:
    cache = str(tmp_path_factory.mktemp("edges"))
    ok(kc("warm", EXAMPLE, "--cache-dir", cache))
    return cache


# -- demo -------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_999", "sm_1", "90", "compute_x"])
def test_demo_bad_arch_is_one_line_naming_the_option(tmp_path, arch) -> None:
    line = one_line(kc("demo", "--arch", arch, "--cache-dir", str(tmp_path / "c")))
    assert "--arch" in line and arch in line


def test_demo_disabled_says_so_and_creates_nothing(tmp_path) -> None:
    cache = tmp_path / "never"
    out = ok(kc("demo", "--m", "32", "--n", "32", "--k", "32", "--cache-dir", str(cache),
                env={"KERNELCACHE_DISABLE": "1"})).stdout
    assert "cache disabled" in out and "MISS" not in out and "compiled and cached" not in out
    assert not cache.exists()
    data = json.loads(ok(kc("demo", "--json", "--cache-dir", str(cache), env={"KERNELCACHE_DISABLE": "1"})).stdout)
    assert data["cache_status"] == "DISABLED" and not cache.exists()


def test_demo_wording_on_a_hit_and_help_texts(tmp_path) -> None:
    cache = str(tmp_path / "c")
    ok(kc("demo", "--m", "32", "--n", "32", "--k", "32", "--cache-dir", cache))
    hit = ok(kc("demo", "--m", "32", "--n", "32", "--k", "32", "--cache-dir", cache)).stdout
    assert "cache status: HIT" in hit
    assert "compiling for" not in hit  # on a hit nothing is compiled
    if "No CUDA GPU" in hit:
        assert "host prep" not in hit  # without a GPU there is no host prep: lookup, compile and store are shown
    help_text = ok(kc("demo", "--help")).stdout
    for opt in ("--tile-size", "--m", "--n", "--k", "--warmup", "--iterations", "--device", "--epilogue"):
        line = next(ln for ln in help_text.splitlines() if ln.strip().startswith(opt))
        rest = line.strip()[len(opt) :].strip()
        rest = rest.split(maxsplit=1)[1] if rest.startswith(("INTEGER", "[")) and " " in rest else rest
        assert len(rest) > 10, f"{opt} has no help text: {line!r}"


# -- warm -------------------------------------------------------------------------------------


def test_warm_shows_the_whole_compiler_log(tmp_path) -> None:
    manifest = tmp_path / "bad.json"
    manifest.write_text(json.dumps({"kernel": [{"name": "bad", "code": BAD_KERNEL}]}))
    proc = kc("warm", str(manifest), "--cache-dir", str(tmp_path / "c"))
    assert proc.returncode == 1
    assert "undefined_a" in proc.stdout and "undefined_b" in proc.stdout
    data = json.loads(kc("warm", str(manifest), "--json", "--cache-dir", str(tmp_path / "c")).stdout)
    assert "undefined_a" in data[0]["error"] and "undefined_b" in data[0]["error"]


def test_warm_include_path_is_relative_to_the_manifest(tmp_path) -> None:
    proj = tmp_path / "proj"
    (proj / "inc").mkdir(parents=True)
    (proj / "inc" / "val.h").write_text("#define VAL 3\n")
    (proj / "k.cu").write_text('#include "val.h"\nextern "C" __global__ void k(int* a) { a[0] = VAL; }\n')
    (proj / "m.toml").write_text('[[kernel]]\nname = "k"\nsource = "k.cu"\noptions = { include_path = ["inc"] }\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "kernelcache", "warm", str(proj / "m.toml"), "--json", "--cache-dir", str(tmp_path / "c")],
        capture_output=True, text=True, cwd=elsewhere, timeout=300,
        env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")},  # the checkout's code, from any cwd
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "error" not in json.loads(proc.stdout)[0]


@pytest.mark.parametrize(
    "body, word",
    [
        ('[defaults]\narch = 90\n[[kernel]]\ncode = "x"\n', "arch"),
        ('arch = "sm_90"\n[[kernel]]\ncode = "x"\n', "top-level"),
        ('defaults = "x"\n[[kernel]]\ncode = "x"\n', "defaults"),
        ('[[kernel]]\ncode = "x"\noptions = "fast"\n', "options"),
        ('[[kernel]]\ncode = "x"\nname_expressions = 5\n', "name_expressions"),
        ('[[kernel]]\ncode = "x"\ntarget = 3\n', "target"),
        ('[[kernel]]\ncode = 3\n', "code"),
    ],
)
def test_warm_manifest_type_errors_are_one_line(tmp_path, body, word) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(body)
    line = one_line(kc("warm", str(manifest), "--cache-dir", str(tmp_path / "c")))
    assert word in line


def test_warm_name_expressions_as_a_string(tmp_path) -> None:
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        '[[kernel]]\nname = "k"\ncode = "template <int N> __global__ void k(int* a) { a[0] = N; }"\n'
        'name_expressions = "k<1>"\n'
    )
    cache = str(tmp_path / "c")
    data = json.loads(ok(kc("warm", str(manifest), "--json", "--cache-dir", cache)).stdout)
    assert "error" not in data[0]
    rows = json.loads(ok(kc("ls", "--json", "--cache-dir", cache)).stdout)
    assert rows[0]["kernels"] == ["k<1>"]


def test_warm_and_verify_print_progress_without_a_tty(tmp_path) -> None:
    cache = str(tmp_path / "c")
    out = ok(kc("warm", EXAMPLE, "-j", "1", "--cache-dir", cache)).stderr
    assert out.count("warm ") >= 4 and "[4/4]" in out
    out = ok(kc("verify", "--cache-dir", cache)).stderr
    assert re.search(r"verify \[(\d+)/\1\]", out), out  # the last line: all checked


# -- prune / clear / verify -----------------------------------------------------------------------


def test_prune_removes_manifests_and_clear_counts_alike(tmp_path) -> None:
    cache = str(tmp_path / "c")
    manifest = tmp_path / "m.toml"
    # The probe makes the source one that can name a header: it gets a header manifest.
    manifest.write_text(
        '[[kernel]]\nname = "k"\n'
        'code = "#if __has_include(\\"none.h\\")\\n#endif\\nextern \\"C\\" __global__ void k() {}"\n'
    )
    ok(kc("warm", str(manifest), "--cache-dir", cache))
    # Bookkeeping: the header manifest, the header variant it names (a record of its own), the
    # preprocessing hint of its header pass (compile.tracing) and the source index (explained
    # misses), four records.
    dry = json.loads(ok(kc("prune", "--older-than", "0s", "--dry-run", "--json", "--cache-dir", cache)).stdout)
    assert dry["removed"] == 1 and dry["dry_run"] is True and dry["manifests_removed"] == 4
    assert len(json.loads(ok(kc("ls", "--json", "--cache-dir", cache)).stdout)) == 1  # nothing removed
    text = ok(kc("prune", "--older-than", "0s", "--dry-run", "--cache-dir", cache)).stdout
    assert "would remove 1 entries" in text
    pruned = json.loads(ok(kc("prune", "--older-than", "0s", "--json", "--cache-dir", cache)).stdout)
    assert pruned["removed"] == 1 and pruned["manifests_removed"] == 4
    files = [f for _, _, fs in os.walk(os.path.join(cache)) for f in fs if f.endswith(".meta")]
    assert files == []  # no manifest left behind
    ok(kc("warm", str(manifest), "--cache-dir", cache))
    verify = json.loads(ok(kc("verify", "--json", "--cache-dir", cache)).stdout)
    ls = json.loads(ok(kc("ls", "--json", "--cache-dir", cache)).stdout)
    assert verify["checked"] == len(ls) == 1 and verify["manifests_checked"] == 4
    assert "removed 1 entries" in ok(kc("clear", "--yes", "--cache-dir", cache)).stdout


def test_prune_max_size_overflow_is_one_line(tmp_path) -> None:
    line = one_line(kc("prune", "--max-size", "1" + "0" * 400 + "TB", "--cache-dir", str(tmp_path)))
    assert "bad size" in line


def test_clear_exit_codes_agree(tmp_path) -> None:
    cache = str(tmp_path / "c")
    FileStreamProgramCache(cache).close()  # a cache root: clear asks before it removes anything
    ok(kc("stats", "--cache-dir", cache))
    no_stdin = kc("clear", "--cache-dir", cache)
    answered_no = kc("clear", "--cache-dir", cache, stdin="n\n")
    assert no_stdin.returncode == answered_no.returncode == 1
    assert "nothing removed" in no_stdin.stderr and "nothing removed" in answered_no.stderr
    assert "Aborted" not in no_stdin.stderr
    assert ok(kc("clear", "--cache-dir", cache, stdin="y\n")).returncode == 0


@pytest.mark.parametrize("command", [["stats"], ["ls"], ["verify"], ["show", "abcd"], ["prune", "--older-than", "1d"]])
def test_mistyped_cache_dir_creates_nothing(tmp_path, command) -> None:
    typo = tmp_path / "no-such-cache"
    line = one_line(kc(*command, "--cache-dir", str(typo)))
    assert "no cache" in line and str(typo) in line
    assert not typo.exists()


# -- ls / show / export ---------------------------------------------------------------------------


def test_ls_has_an_arch_column_and_a_prefix_show_accepts(warm_cache) -> None:
    rows = json.loads(ok(kc("ls", "--json", "--cache-dir", warm_cache)).stdout)
    assert {r["arch"] for r in rows} == {"sm_80", "sm_90"}
    env = {"COLUMNS": "80"}
    text = ok(kc("ls", "--cache-dir", warm_cache, env=env)).stdout
    assert "sm_80" in text and "sm_90" in text
    for r in rows:
        shown = next(ln for ln in text.splitlines() if r["key"][:8] in ln)
        prefix = next(tok for tok in shown.replace("│", " ").split() if r["key"].startswith(tok))
        assert len(prefix) >= 8 and "…" not in prefix
        ok(kc("show", prefix, "--cache-dir", warm_cache))


def test_ls_survives_unusual_metadata(tmp_path) -> None:
    cache = str(tmp_path / "c")
    manifest = tmp_path / "m.toml"
    manifest.write_text('[[kernel]]\nname = "k"\ncode = "extern \\"C\\" __global__ void k() {}"\n')
    ok(kc("warm", str(manifest), "--cache-dir", cache))
    from kernelcache.stores.file.sidecar import META_SUFFIX  # the sidecar: header line + JSON

    sidecars = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(META_SUFFIX)]
    for path in sidecars:
        with open(path, "rb") as f:
            head, _, body = f.read().partition(b"\n")
        meta = json.loads(body)
        if meta.get("kind") == "manifest":
            continue
        meta.update(kernels=5, compile_seconds="slow", code_type=None, options=["x"], toolchain="y")
        with open(path, "wb") as f:
            f.write(head + b"\n" + json.dumps(meta).encode())
    proc = kc("ls", "--cache-dir", cache)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert ok(kc("ls", "--json", "--cache-dir", cache)).stdout


def test_show_prints_values_not_python_reprs(warm_cache) -> None:
    rows = json.loads(ok(kc("ls", "--json", "--cache-dir", warm_cache)).stdout)
    key = next(r["key"] for r in rows if r["kernels"] == ["saxpy"] and r["target_type"] == "cubin")
    text = ok(kc("show", key[:12], "--cache-dir", warm_cache)).stdout
    assert "arch = sm_90" in text and "'sm_90'" not in text and "b'" not in text
    data = json.loads(ok(kc("show", key[:12], "--json", "--cache-dir", warm_cache)).stdout)
    assert data["meta"]["options"]["arch"] == "sm_90"
    assert data["meta"]["options"]["std"] == "c++17"
    assert all(not (isinstance(v, str) and v.startswith(("'", "b'"))) for v in data["meta"]["options"].values())


def test_export_to_stdout_and_json(warm_cache, tmp_path) -> None:
    rows = json.loads(ok(kc("ls", "--json", "--cache-dir", warm_cache)).stdout)
    cubin = next(r for r in rows if r["target_type"] == "cubin")
    proc = subprocess.run(
        [sys.executable, "-m", "kernelcache", "export", cubin["key"][:12], "-o", "-", "--cache-dir", warm_cache],
        capture_output=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")},
    )
    assert proc.returncode == 0 and proc.stdout[:4] == b"\x7fELF" and len(proc.stdout) == cubin["size"]
    assert not (tmp_path / "-").exists()
    out = tmp_path / "x.cubin"
    data = json.loads(ok(kc("export", cubin["key"][:12], "-o", str(out), "--json", "--cache-dir", warm_cache)).stdout)
    assert data == {"key": cubin["key"], "bytes": cubin["size"], "output": str(out)}


# -- explain ----------------------------------------------------------------------------------------


def test_explain_names_each_changed_header_and_keeps_last_used(tmp_path) -> None:
    proj = tmp_path / "proj"
    (proj / "inc").mkdir(parents=True)
    (proj / "inc" / "a.h").write_text("#define A 1\n")
    (proj / "inc" / "b.h").write_text("#define B 2\n")
    (proj / "k.cu").write_text(
        '#include "a.h"\n#include "b.h"\nextern "C" __global__ void k(int* x) { x[0] = A + B; }\n'
    )
    (proj / "m.toml").write_text('[[kernel]]\nname = "k"\nsource = "k.cu"\noptions = { include_path = ["inc"] }\n')
    cache = str(tmp_path / "c")
    ok(kc("warm", str(proj / "m.toml"), "--cache-dir", cache))
    entry = json.loads(ok(kc("ls", "--json", "--cache-dir", cache)).stdout)[0]
    past = time.time() - 3600
    os.utime(_entry_path(cache, entry["key"]), (past, past))
    before = json.loads(ok(kc("ls", "--json", "--cache-dir", cache)).stdout)[0]["last_used"]
    hit = json.loads(ok(kc("explain", str(proj / "m.toml"), "--json", "--cache-dir", cache)).stdout)
    assert hit["in_cache"] is True
    (proj / "inc" / "a.h").write_text("#define A 5\n")
    missed = kc("explain", str(proj / "m.toml"), "--json", "--cache-dir", cache)
    assert missed.returncode == 1, missed.stderr  # not in the cache
    result = json.loads(missed.stdout)
    assert result["in_cache"] is False
    headers = result["headers"]
    assert headers["changed"] == [str(proj / "inc" / "a.h")] and headers["added"] == headers["vanished"] == []
    text = kc("explain", str(proj / "m.toml"), "--cache-dir", cache).stdout
    assert "header changed: " + str(proj / "inc" / "a.h") in text and "b.h" not in text
    (proj / "inc" / "b.h").unlink()
    gone = json.loads(kc("explain", str(proj / "m.toml"), "--json", "--cache-dir", cache).stdout)["headers"]
    assert gone["vanished"] == [str(proj / "inc" / "b.h")] and gone["changed"] == [str(proj / "inc" / "a.h")]
    after = json.loads(ok(kc("ls", "--json", "--cache-dir", cache)).stdout)[0]["last_used"]
    assert after == before  # probing did not move last_used


def _entry_path(cache: str, name: str) -> str:
    for d, _, fs in os.walk(cache):
        if name in fs:
            return os.path.join(d, name)
    raise AssertionError(name)
