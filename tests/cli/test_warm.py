"""``kernelcache warm`` of a recorded run: the replay is the recorded request (options in their
own form, CuPy's command line, the working directory), so the recorded program then hits
every kernel under KERNELCACHE_REQUIRE_HIT=1; and a kernel is ok only once it is stored.
Real compiles, real processes, real directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers import ARCH, settle_timestamps

from kernelcache import FileStreamProgramCache

# The recorded program, run in its project directory: an include_path given as a str, a
# relative one, a header found through the working directory (no include path at all), and
# CuPy's command line (what kernelcache.cupy compiles: argv_options of CuPy's flags).
PROGRAM = textwrap.dedent(
    """
    import json, os
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, compile_program
    from kernelcache.compile.nvrtc_argv import argv_options
    body = 'extern "C" __global__ void {0}(float* a) {{ a[threadIdx.x] = SCALE + N; }}\\n'
    calls = [
        ("k_str", '#include "scale.h"\\n', ProgramOptions(arch="ARCH", include_path=os.path.abspath("inc"),
                                                        define_macro=("N", "1"))),
        ("k_rel", '#include "scale.h"\\n', ProgramOptions(arch="ARCH", include_path="inc", define_macro="N=2")),
        ("k_cwd", '#include "local.h"\\n', ProgramOptions(arch="ARCH", define_macro=["N=3"])),
        ("k_cupy", '#include "scale.h"\\n', argv_options(("-I", "inc", "-DN=4", "-ftz=true", "-arch=ARCH",
                                                          "--device-as-default-execution-space"))),
    ]
    out = {}
    for name, head, options in calls:
        info = CompileInfo()
        compile_program(head + body.format(name), options=options, info=info)
        out[name] = {"hit": info.hit, "key": info.entry_name}
    print(json.dumps(out))
    """
).replace("ARCH", ARCH)


def _project(root) -> str:
    proj = root / "proj"
    (proj / "inc").mkdir(parents=True)
    (proj / "inc" / "scale.h").write_text("#define SCALE 2.0f\n")
    (proj / "local.h").write_text("#define SCALE 5.0f\n")
    settle_timestamps()
    return str(proj)


def _run(code: str, cwd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def _kc(*args: str, cwd: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KERNELCACHE_RECORD": "", **(env or {})},
    )


def test_a_recorded_run_warmed_from_another_directory_hits_every_request_strictly(tmp_path) -> None:
    proj, lock = _project(tmp_path), str(tmp_path / "kernels.lock")
    first = _run(PROGRAM, proj, {"KERNELCACHE_DIR": str(tmp_path / "first"), "KERNELCACHE_RECORD": lock})
    assert first.returncode == 0, first.stderr
    recorded = json.loads(first.stdout)
    with open(lock) as f:
        lines = [json.loads(line)["kernel"][0] for line in f]
    by_name = {k["name"]: k for k in lines}
    assert by_name["k_str"]["options"]["include_path"] == os.path.join(proj, "inc")  # a str, as given
    assert by_name["k_cupy"]["nvrtc_argv"][:2] == ["-I", "inc"]  # CuPy's command line, verbatim
    assert {k["cwd"] for k in lines} == {proj}

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fresh = str(tmp_path / "fresh")
    warm = _kc("warm", lock, "--cache-dir", fresh, "--json", cwd=str(elsewhere))
    assert warm.returncode == 0, warm.stdout + warm.stderr
    warmed = {r["name"]: r for r in json.loads(warm.stdout)}
    assert all(not r.get("error") for r in warmed.values()), warmed
    assert os.getcwd() != proj and not os.listdir(elsewhere)  # nothing written where warm ran

    again = _run(PROGRAM, proj, {"KERNELCACHE_DIR": fresh, "KERNELCACHE_REQUIRE_HIT": "1"})
    assert again.returncode == 0, again.stderr  # a miss would raise CacheMissError
    hits = json.loads(again.stdout)
    assert all(h["hit"] for h in hits.values()), hits
    assert {n: h["key"] for n, h in hits.items()} == {n: r["key"] for n, r in recorded.items()}
    assert {n: r["key"] for n, r in warmed.items()} == {n: r["key"] for n, r in recorded.items()}


def test_a_recorded_working_directory_that_is_gone_is_said_per_kernel(tmp_path) -> None:
    proj, lock = _project(tmp_path), str(tmp_path / "kernels.lock")
    _run(PROGRAM, proj, {"KERNELCACHE_DIR": str(tmp_path / "first"), "KERNELCACHE_RECORD": lock})
    os.rename(proj, str(tmp_path / "moved"))
    warm = _kc("warm", lock, "--cache-dir", str(tmp_path / "fresh"), cwd=str(tmp_path))
    assert warm.returncode == 1
    for name in ("k_str", "k_rel", "k_cwd", "k_cupy"):
        (line,) = [ln for ln in warm.stdout.splitlines() if ln.startswith(name + " ")]
        assert f"its recorded working directory {proj} is not here" in line and "error: " in line, line
    assert "0 ok, 4 failed" in warm.stdout


# A header under KERNELCACHE_BASE_DIR that names its own path (__FILE__): the compile is
# returned but not stored (it differs between checkouts).
WHERE = 'extern "C" __global__ void {0}(const char** o) {{ o[0] = __FILE__; }}\n'


def test_warm_fails_each_kernel_it_could_not_store_and_writes_no_bundle(tmp_path) -> None:
    proj = tmp_path / "proj"
    (proj / "inc").mkdir(parents=True)
    (proj / "inc" / "where.h").write_text("__device__ const char* where() { return __FILE__; }\n")
    settle_timestamps()
    kernels = [
        {"name": "plain", "code": 'extern "C" __global__ void plain(float* a) { a[0] = 1.0f; }'},
        {
            "name": "names_its_file",
            "code": '#include "where.h"\nextern "C" __global__ void names_its_file(const char** o) { o[0] = where(); }',
            "options": {"include_path": ["inc"]},
        },
    ]
    manifest = proj / "m.json"
    manifest.write_text(json.dumps({"defaults": {"arch": ARCH}, "kernel": kernels}))
    env = {"KERNELCACHE_BASE_DIR": str(proj)}
    out = tmp_path / "k.kcb"
    warm = _kc("warm", str(manifest), "--cache-dir", str(tmp_path / "c"), "--bundle", str(out), env=env)
    assert warm.returncode == 1, warm.stdout + warm.stderr
    lines = warm.stdout.splitlines()
    (bad,) = [ln for ln in lines if ln.startswith("names_its_file ")]
    assert "not stored" in bad and "KERNELCACHE_BASE_DIR" in bad, bad
    assert [ln for ln in lines if ln.startswith("plain ")] == [f"plain [{ARCH} cubin]: compiled"]
    assert "1 ok, 1 failed" in warm.stdout and "no bundle written" in warm.stdout
    assert not out.exists()
    as_json = _kc("warm", str(manifest), "--cache-dir", str(tmp_path / "c"), "--json", env=env)
    assert as_json.returncode == 1
    results = {r["name"]: r for r in json.loads(as_json.stdout)}
    assert results["plain"]["hit"] and not results["plain"].get("error")
    assert results["names_its_file"]["error"].startswith("not stored: ")


WITHOUT_WORKERS = textwrap.dedent(
    """
    import os, sys
    sys.executable = os.path.join(sys.argv[1], "no-such-python")  # no compiler worker can start
    from kernelcache.cli.main import main
    sys.argv = ["kernelcache", "warm", sys.argv[2], "--cache-dir", sys.argv[3], "-j", "1"]
    main()
    """
)


def test_warm_where_workers_cannot_start_stores_a_restrict_kernel_and_what_follows_it(tmp_path) -> None:
    # restrict=True then compiles in a process forked for it alone (runners.choice), never in
    # warm's own: NVRTC's --restrict stays out of the later compiles, which are stored as well.
    kernels = [
        {
            "name": "restricted",
            "code": 'extern "C" __global__ void restricted(float* a) { a[0] = 1.0f; }',
            "options": {"restrict": True},
        },
        {"name": "after", "code": 'extern "C" __global__ void after(float* a, const float* b) { a[0] = b[0]; }'},
    ]
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"defaults": {"arch": ARCH}, "kernel": kernels}))
    cache = str(tmp_path / "c")
    warm = subprocess.run(
        [sys.executable, "-c", WITHOUT_WORKERS, str(tmp_path), str(manifest), cache],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "KERNELCACHE_RECORD": ""},
    )
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert "2 ok, 0 failed" in warm.stdout
    with FileStreamProgramCache(cache) as store:
        kernels_stored = [e.meta["meta"].get("kernels") for e in store.iter_entries() if e.meta["meta"].get("kernels")]
    assert sorted(kernels_stored) == [["after"], ["restricted"]]


def test_a_request_made_in_a_deleted_directory_is_replayed_in_an_empty_one(tmp_path) -> None:
    code = textwrap.dedent(
        """
        import os, sys
        from cuda.core import ProgramOptions
        from kernelcache import compile_program
        os.chdir(sys.argv[1]); os.rmdir(sys.argv[1])
        compile_program('extern "C" __global__ void k(float* a) { a[0] = 4.0f; }', options=ProgramOptions(arch="ARCH"))
        """
    ).replace("ARCH", ARCH)
    (tmp_path / "gone").mkdir()
    lock = str(tmp_path / "lock.json")
    env = {"KERNELCACHE_RECORD": lock, "KERNELCACHE_DIR": str(tmp_path / "first")}
    made = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "gone")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert made.returncode == 0, made.stderr
    with open(lock) as f:
        (line,) = [json.loads(raw)["kernel"][0] for raw in f]
    assert line["cwd"] is None
    warm = _kc("warm", lock, "--cache-dir", str(tmp_path / "fresh"), cwd=str(tmp_path))
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert "(replayed in an empty directory: it was recorded in a deleted directory): compiled" in warm.stdout


SAME_SOURCE = textwrap.dedent(
    """
    import json
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, compile_program
    info = CompileInfo()
    obj = compile_program('#include "local.h"\\nextern "C" __global__ void k(float* a) { a[0] = SCALE; }\\n',
                          options=ProgramOptions(arch="ARCH"), info=info)
    print(json.dumps({"hit": info.hit, "key": info.entry_name, "size": len(obj.code)}))
    """
).replace("ARCH", ARCH)


def test_one_request_recorded_in_two_directories_is_warmed_in_each(tmp_path) -> None:
    # The same call in two checkouts reads each one's local.h. warm -j 4 replays both lines
    # of one lockfile: each must be compiled in its own directory (the working directory is
    # the process's: warm takes one directory at a time), so each checkout then hits its own.
    lock, recorded = str(tmp_path / "kernels.lock"), {}
    for name, scale in (("a", "1.0f"), ("b", "2.0f")):
        proj = tmp_path / name
        proj.mkdir()
        (proj / "local.h").write_text(f"#define SCALE {scale}\n")
        settle_timestamps()
        made = _run(
            SAME_SOURCE, str(proj), {"KERNELCACHE_DIR": str(tmp_path / name / "own"), "KERNELCACHE_RECORD": lock}
        )
        assert made.returncode == 0, made.stderr
        recorded[name] = json.loads(made.stdout)["key"]
    assert recorded["a"] != recorded["b"]
    fresh = str(tmp_path / "fresh")
    warm = _kc("warm", lock, "--cache-dir", fresh, "-j", "4", "--json", cwd=str(tmp_path))
    assert warm.returncode == 0, warm.stdout + warm.stderr
    assert sorted(r["key"] for r in json.loads(warm.stdout)) == sorted(recorded.values())
    for name in ("a", "b"):
        again = _run(SAME_SOURCE, str(tmp_path / name), {"KERNELCACHE_DIR": fresh, "KERNELCACHE_REQUIRE_HIT": "1"})
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["key"] == recorded[name]
