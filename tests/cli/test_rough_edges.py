"""The rough edges an operator hit with the command line and the package, each provoked for real."""

from __future__ import annotations

import os
import subprocess
import sys


def _kc(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernelcache", *args], capture_output=True, text=True, env=env, timeout=120, **kw
    )


def test_several_bad_variables_are_one_line_each(tmp_path) -> None:
    env = {**os.environ, "KERNELCACHE_DIR": str(tmp_path), "KERNELCACHE_MAX_SIZE": "lots"}
    env.update(KERNELCACHE_WAIT_TIMEOUT="-1", KERNELCACHE_DISABLE="maybe")
    proc = _kc("stats", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 3, proc.stderr
    assert all(line.startswith("kernelcache: error: KERNELCACHE_") for line in lines)
    assert sorted(line.split()[2].split("=")[0].rstrip(":") for line in lines) == [
        "KERNELCACHE_DISABLE",
        "KERNELCACHE_MAX_SIZE",
        "KERNELCACHE_WAIT_TIMEOUT",
    ]


def _cache_with(root: str, n: int, kernels: list[str] | None = None) -> None:
    from kernelcache import FileStreamProgramCache

    with FileStreamProgramCache(root) as cache:
        for i in range(n):
            meta = {"code_type": "c++", "target_type": "cubin", "arch": "sm_90", "kernels": kernels or [f"k{i}"]}
            cache.set_record(f"key-{i}".encode(), b"\x7fELF" + bytes(200), meta)


def test_a_tilde_in_cache_dir_is_the_home_directory(tmp_path) -> None:
    home = tmp_path / "home"
    _cache_with(str(home / "kc"), 1)
    env = {**os.environ, "HOME": str(home)}
    for args in (["--cache-dir=~/kc"], ["--cache-dir", "~/kc"]):
        proc = _kc("stats", *args, "--json", env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert '"entries": 1' in proc.stdout
    assert not os.path.exists(tmp_path / "~")


def test_allow_shared_is_accepted_before_the_subcommand(tmp_path) -> None:
    root = tmp_path / "team"
    root.mkdir()
    os.chmod(root, 0o2770)
    from kernelcache import FileStreamProgramCache

    FileStreamProgramCache(root, allow_shared=True).close()
    refused = _kc("stats", "--cache-dir", str(root))
    assert refused.returncode == 2 and "--allow-shared" in refused.stderr  # the flag the refusal suggests
    proc = _kc("--allow-shared", "stats", "--cache-dir", str(root))
    assert proc.returncode == 0, proc.stderr


def test_prune_max_size_0_means_no_cap_as_for_the_variable(tmp_path) -> None:
    _cache_with(str(tmp_path / "c"), 3)
    proc = _kc("prune", "--max-size", "0", "--cache-dir", str(tmp_path / "c"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert '"removed": 0' in proc.stdout
    assert '"entries": 3' in _kc("stats", "--json", "--cache-dir", str(tmp_path / "c")).stdout


def test_a_closed_pipe_is_no_error(tmp_path) -> None:
    _cache_with(str(tmp_path / "c"), 3000)
    for args in (["ls"], ["stats"], ["ls", "--json"]):
        reader = subprocess.Popen(
            [sys.executable, "-m", "kernelcache", *args, "--cache-dir", str(tmp_path / "c")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert reader.stdout is not None and reader.stderr is not None
        reader.stdout.readline()  # `| head -1`: one line read, then the pipe closes
        reader.stdout.close()
        err = reader.stderr.read().decode()
        assert reader.wait(timeout=120) == 0, err
        assert "Broken pipe" not in err and "Traceback" not in err


def test_export_to_a_terminal_is_refused(tmp_path) -> None:
    import pty

    _cache_with(str(tmp_path / "c"), 1)
    main, child = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "kernelcache", "export", "key", "-o", "-", "--cache-dir", str(tmp_path / "c")],
            stdout=child,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(child)
    os.set_blocking(main, False)
    try:
        written = os.read(main, 4096)
    except (BlockingIOError, OSError):
        written = b""
    os.close(main)
    assert proc.returncode == 2 and "terminal" in proc.stderr
    assert b"ELF" not in written
    # to a file or a pipe it works
    entry = _kc("ls", "--json", "--cache-dir", str(tmp_path / "c")).stdout.split('"key": "')[1][:12]
    out = subprocess.run(
        [sys.executable, "-m", "kernelcache", "export", entry, "-o", "-", "--cache-dir", str(tmp_path / "c")],
        capture_output=True,
    )
    assert out.returncode == 0 and out.stdout.startswith(b"\x7fELF")


def test_ls_keeps_kernel_names_whole(tmp_path) -> None:
    names = [f"very_long_kernel_name_number_{i}<float, 128>" for i in range(4)]
    _cache_with(str(tmp_path / "c"), 1, kernels=names)
    wide = _kc("ls", "--cache-dir", str(tmp_path / "c"), env={**os.environ, "COLUMNS": "400"}).stdout
    assert ", ".join(names) in wide
    narrow = _kc("ls", "--cache-dir", str(tmp_path / "c"), env={**os.environ, "COLUMNS": "80"}).stdout
    folded = " ".join(line.strip() for line in narrow.splitlines()[3:])
    assert all(name.split("<")[0] in folded for name in names)


_RECACHE = """
import sys
from cuda.core import ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
cache = FileStreamProgramCache(sys.argv[1])
info = CompileInfo()
obj = compile_program('extern "C" __global__ void k(float* x) { x[0] = 3; }', options=ProgramOptions(arch=sys.argv[2]),
                      cache=cache, info=info)
print(info.hit, cache.stats()["compiles"], bytes(obj.code).startswith(b"\\x7fELF"), info.key.hex())
"""


def test_recache_compiles_stores_and_replaces_for_one_run(tmp_path) -> None:
    from helpers import ARCH

    from kernelcache import FileStreamProgramCache

    root = str(tmp_path / "c")

    def run(**extra: str) -> list[str]:
        env = {**os.environ, **extra}
        proc = subprocess.run([sys.executable, "-c", _RECACHE, root, ARCH], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    hit, compiles, _, key = run()
    assert (hit, compiles) == ("False", "1")
    with FileStreamProgramCache(root) as cache:  # the stored entry goes stale (bytes from elsewhere)
        payload, meta = cache.get_record(bytes.fromhex(key))
        cache.set_record(bytes.fromhex(key), b"stale bytes", meta)
    assert run()[:3] == ["True", "1", "False"]  # served stale
    assert run(KERNELCACHE_RECACHE="1")[:3] == ["False", "2", "True"]  # compiled again and stored
    assert run()[:3] == ["True", "2", "True"]  # the next run hits the fresh entry
    proc = _kc("stats", env={**os.environ, "KERNELCACHE_RECACHE": "sometimes"})
    assert proc.returncode == 2 and "KERNELCACHE_RECACHE" in proc.stderr


def test_import_without_fcntl_says_which_platforms_run_it() -> None:
    # A platform without fcntl (Windows): provoked by making the fcntl module unimportable.
    code = "import sys; sys.modules['fcntl'] = None\nimport kernelcache"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kernelcache runs on Linux and macOS") and "fcntl" in last


def test_entries_written_by_cuda_core_say_what_they_are_in_ls(tmp_path) -> None:
    import json

    from cuda.core import Program, ProgramOptions
    from helpers import ARCH

    from kernelcache import FileStreamProgramCache

    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        src = 'extern "C" __global__ void k(float* x) { x[0] = 1; }'
        Program(src, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=cache)  # cuda.core writes it
        cache[b"raw-ptx"] = b"//\n.version 8.8\n.target sm_80\n.address_size 64\n"  # and a plain mapping write
    rows = json.loads(_kc("ls", "--json", "--cache-dir", root).stdout)
    got = sorted((r["code_type"], r["target_type"], r["arch"]) for r in rows)
    assert got == [("bytes", "ptx", "sm_80"), ("cuda.core", "cubin", ARCH)]
