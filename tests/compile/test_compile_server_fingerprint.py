"""The compile server's name (compile/fingerprint.py): what a worker takes from the process that
starts it must be in it, so that a process never gets a worker built for another environment.
Real servers, real child processes, a real chroot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers import ARCH
from test_compile_server import CHILD, child, served, wait_for
from test_compile_server import server_dir as server_dir  # the fixture: a runtime dir of the test's

from kernelcache.compile import server_link

pytestmark = pytest.mark.usefixtures("server_dir")


def test_a_process_that_imports_kernelcache_from_its_cwd_gets_a_server_that_does_too(tmp_path) -> None:
    # `python -c` in a directory holding the package: found through '' in sys.path, i.e. this
    # cwd; the server and its workers run in / and must find the very same package.
    import kernelcache

    here = os.path.dirname(os.path.dirname(kernelcache.__file__))
    env = {**os.environ, "PYTHONPATH": ""}

    def run(root: str) -> dict:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, root, "0", "2"],
            capture_output=True, text=True, env=env, cwd=here, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    result = served(run, str(tmp_path / "a"))
    assert (result["adopted"], result["warnings"]) == (2, [])
    assert result["sha"] == child(str(tmp_path / "b"), 0, 2)["sha"]


LTO_CHILD = r"""
import hashlib, json, sys
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile.workers import pool
root, processes = sys.argv[1], sys.argv[2] == "1"
src = 'extern "C" __global__ void l{i}(float* a) {{ a[threadIdx.x] *= {i}.25f; }}\n'
reqs = [{"code": src.format(i=i), "target_type": "ltoir",
         "options": ProgramOptions(arch="%s", link_time_optimization=True)} for i in range(2)]
objs = compile_many(reqs, cache=FileStreamProgramCache(root), processes=processes, max_workers=2)
print(json.dumps({"adopted": pool().adopted, "sha": [hashlib.sha256(bytes(o.code)).hexdigest() for o in objs]}))
""" % ARCH  # noqa: UP031 - the kernel source has braces of its own


def _lto_child(root: str, processes: bool, **env: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", LTO_CHILD, root, "1" if processes else "0"],
        capture_output=True, text=True, env={**os.environ, **env}, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_variable_nvrtc_reads_when_it_loads_gets_a_server_of_its_own(tmp_path) -> None:
    # libnvrtc's LLVM reads LLVM_OVERRIDE_PRODUCER once, when it is loaded, and writes it into
    # every LTO-IR it makes: a worker loaded NVRTC in the environment of the server's first
    # process, and a later compile's environment cannot change what it read then.
    plain = served(lambda root: _lto_child(root, True), str(tmp_path / "a"))
    assert plain["adopted"] == 2  # a server runs, its workers loaded NVRTC without the variable
    here = _lto_child(str(tmp_path / "b"), False, LLVM_OVERRIDE_PRODUCER="kernelcache-test")
    assert here["sha"] != plain["sha"]  # the variable changes the bytes
    theirs = served(lambda root: _lto_child(root, True, LLVM_OVERRIDE_PRODUCER="kernelcache-test"), str(tmp_path / "c"))
    assert theirs["adopted"] == 2 and theirs["sha"] == here["sha"]


INCLUDE_CHILD = r"""
import hashlib, json, sys
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile.workers import pool
root, processes, header = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
code = '#include "%%s"\nextern "C" __global__ void v{i}(float* a) {{ a[0] = VALUE + {i}; }}\n' %% header
reqs = [{"code": code.format(i=i), "options": ProgramOptions(arch="%s")} for i in range(2)]
objs = compile_many(reqs, cache=FileStreamProgramCache(root), processes=processes, max_workers=2)
print(json.dumps({"adopted": pool().adopted, "sha": [hashlib.sha256(bytes(o.code)).hexdigest() for o in objs]}))
""" % ARCH  # noqa: UP031 - the kernel source has braces of its own


def test_a_process_in_a_chroot_gets_a_server_of_its_own(tmp_path) -> None:
    # Its files are not the server's: a header at the same path with other contents, say.
    if os.geteuid() != 0:
        pytest.skip("needs root to mount and chroot")
    header = tmp_path / "inc" / "value.h"
    header.parent.mkdir()
    header.write_text("#define VALUE 1\n")

    def run(root: str, processes: bool, jail: str | None) -> dict:
        def enter() -> None:  # the chroot, and the same working directory in it
            here = os.getcwd()
            os.chroot(jail)
            os.chdir(here)

        argv = [sys.executable, "-c", INCLUDE_CHILD, root, "1" if processes else "0", str(header)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, preexec_fn=enter if jail else None)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    outside = served(lambda root: run(root, True, None), str(tmp_path / "a"))
    assert outside["adopted"] == 2  # the server runs, outside the chroot
    jail = tmp_path / "jail"
    jail.mkdir()
    mounted: list[str] = []
    try:
        for *how, where in (["--bind", "/", jail], ["--bind", "/proc", f"{jail}/proc"],
                            ["--bind", "/dev", f"{jail}/dev"], ["-t", "tmpfs", "tmpfs", f"{jail}{header.parent}"]):  # fmt: skip
            if subprocess.run(["mount", *how, str(where)], capture_output=True).returncode != 0:
                pytest.skip("cannot mount here")
            mounted.append(str(where))
        with open(f"{jail}{header}", "w") as f:
            f.write("#define VALUE 2\n")  # the same path in the chroot, other contents
        here = run(str(tmp_path / "b"), False, str(jail))
        inside = served(lambda root: run(root, True, str(jail)), str(tmp_path / "c"))
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", "-l", where], capture_output=True)
    assert here["sha"] != outside["sha"]
    assert inside["adopted"] == 2 and inside["sha"] == here["sha"]


def _script(where, name: str = "x.py", source: str = CHILD) -> Callable[[str, int, int], dict]:
    """``python where/name``: its directory is sys.path[0], as for any script."""

    def run(root: str, first: int, count: int) -> dict:
        out = subprocess.run([sys.executable, str(where / name), root, str(first), str(count)],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    where.mkdir(exist_ok=True)
    (where / name).write_text(source)
    return run


def test_scripts_in_directories_that_hold_nothing_a_worker_imports_share_a_server(tmp_path) -> None:
    # Each script's directory is its sys.path[0]; neither holds a module a worker imports at its
    # start (a data file, a helper module of its own, a cache of its bytecode): one server for both.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "helpers.py").write_text("VALUE = 1\n")
    (tmp_path / "b" / "__pycache__").mkdir()
    (tmp_path / "b" / "data").mkdir()
    first = _script(tmp_path / "a")(str(tmp_path / "c1"), 0, 2)
    status = wait_for(lambda: (s := server_link.server_status(first["socket"])) and s["idle"] == s["target"] and s)
    second = _script(tmp_path / "b", "y.py")(str(tmp_path / "c2"), 0, 2)
    assert second["socket"] == first["socket"] and second["adopted"] == 2 and not second["warnings"]
    assert set(second["pids"]) <= set(status["workers"]) and second["sha"] == first["sha"]


def _shadow_cuda(where) -> None:  # a portion of the cuda namespace package: cuda.* may be found there first
    (where / "cuda").mkdir(parents=True)


def _own_kernelcache(where) -> None:  # the script imports this copy, not ours
    import shutil

    import kernelcache

    where.mkdir(parents=True)
    shutil.copytree(os.path.dirname(kernelcache.__file__), where / "kernelcache")


def _shadow_stdlib(where) -> None:  # a module of the standard library a worker imports at its start
    import fnmatch
    import shutil

    where.mkdir(parents=True)
    shutil.copy(fnmatch.__file__, where / "fnmatch.py")


@pytest.mark.parametrize("holds", [_shadow_cuda, _own_kernelcache, _shadow_stdlib])
def test_a_script_directory_that_holds_what_a_worker_imports_gets_a_server_of_its_own(tmp_path, holds) -> None:
    first = _script(tmp_path / "a")(str(tmp_path / "c1"), 0, 2)
    holds(tmp_path / "b")
    second = served(lambda root: _script(tmp_path / "b")(root, 0, 2), str(tmp_path / "c2"))
    assert second["socket"] != first["socket"]
    assert (second["adopted"], second["compiles"], second["warnings"]) == (2, 2, [])


OPTIONS_CHILD = r"""
import json, sys, warnings
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile import server_link
from kernelcache.compile.workers import pool
from lineoptions import LineOptions  # this script's own module, beside it
warnings.simplefilter("always")
root, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = 'extern "C" __global__ void o{i}(float* a) {{ a[threadIdx.x] *= {i}.5f; }}\n'
reqs = [{"code": src.format(i=i), "options": LineOptions(arch="%s", lineinfo=True)} for i in range(first, first + count)]
with warnings.catch_warnings(record=True) as caught:
    compile_many(reqs, cache=FileStreamProgramCache(root), processes=True, max_workers=2)
print(json.dumps({"adopted": pool().adopted, "in_workers": pool().compiles, "socket": server_link.socket_path(),
    "warnings": [str(w.message) for w in caught]}))
""" % ARCH  # noqa: UP031 - the kernel source has braces of its own


def test_a_worker_finds_the_modules_of_the_process_it_serves(tmp_path) -> None:
    # The server's workers started without b/ on their sys.path (it holds nothing they import at
    # their start); the options of b/'s script are a class of b/'s own, which a worker given
    # b/'s compiles must import from there, as one started by that script would.
    first = _script(tmp_path / "a")(str(tmp_path / "c1"), 0, 2)
    wait_for(lambda: (s := server_link.server_status(first["socket"])) and s["idle"] == s["target"])
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "lineoptions.py").write_text("from cuda.core import ProgramOptions\n\n\n"
                                                    "class LineOptions(ProgramOptions):\n    pass\n")  # fmt: skip
    out = _script(tmp_path / "b", source=OPTIONS_CHILD)(str(tmp_path / "c2"), 0, 2)
    assert out["socket"] == first["socket"] and out["adopted"] == 2
    assert (out["in_workers"], out["warnings"]) == (2, [])


class _ReportModules:
    """Unpickled in a worker, it writes down the top-level names of the modules loaded from files there."""

    def __init__(self, out: str) -> None:
        self.out = out

    def __reduce__(self):  # noqa: ANN204 - pickle's protocol
        code = ("import json, sys; json.dump(sorted({n.split('.')[0] for n, m in list(sys.modules.items())"
                f" if getattr(m, '__file__', None)}}), open({self.out!r}, 'w'))")  # fmt: skip
        return (exec, (code,))


def test_a_warm_worker_imported_only_what_its_servers_name_covers(tmp_path) -> None:
    # A directory left out of a server's name must hold nothing a worker imported before its
    # first compile: what a real, warm worker of a server has loaded by then.
    import pickle

    from kernelcache.compile import fingerprint

    assert server_link.adopt_worker() is None  # starts the server; this process does not wait for it
    wait_for(lambda: (s := server_link.server_status()) and s["idle"] == s["target"])
    worker = server_link.adopt_worker()
    assert worker is not None
    try:
        worker.exchange("program", pickle.dumps((_ReportModules(str(tmp_path / "names.json")),)))
    finally:
        worker.close(kill=True)
    names = json.loads((tmp_path / "names.json").read_text())
    assert "kernelcache" in names and "cuda" in names
    assert [n for n in names if n not in fingerprint._START_NAMES and not n.startswith("_")] == []
PYC_CHILD = r"""
import json, sys
from kernelcache.compile.fingerprint import fingerprint
before = fingerprint()
import kc_fresh_module  # its first import writes site-packages/__pycache__/, which changes the directory
print(json.dumps([before, fingerprint()]))
"""


def test_writing_bytecode_into_site_packages_keeps_the_fingerprint(tmp_path) -> None:
    # A fresh image or venv has no .pyc yet: a process's first imports write __pycache__
    # directories, which changes their parents' mtimes. No install happened: the same server
    # must serve before and after (it split once per package directory, in mid-process too).
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "kc_fresh_module.py").write_text("VALUE = 1\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(site)])
    out = subprocess.run([sys.executable, "-c", PYC_CHILD], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (site / "__pycache__").is_dir()  # the import did write one
    before, after = json.loads(out.stdout)
    assert before == after
    # An install (a new dist-info) is what changes it.
    (site / "kc_fresh_module-1.0.dist-info").mkdir()
    out = subprocess.run([sys.executable, "-c", PYC_CHILD], capture_output=True, text=True, env=env, timeout=60)
    assert json.loads(out.stdout)[0] != before


PATHLIB_CHILD = r"""
import json, pathlib, sys, warnings
sys.path.append(pathlib.Path(sys.argv[2]))  # common, and ignored by imports: they use str entries only
from cuda.core import ProgramOptions
from kernelcache import FileStreamProgramCache, compile_many
from kernelcache.compile.workers import pool
warnings.simplefilter("always")
src = 'extern "C" __global__ void p{i}(float* a) {{ a[0] = {i}; }}\n'
reqs = [{"code": src.format(i=i), "options": ProgramOptions(arch="%s")} for i in range(2)]
with warnings.catch_warnings(record=True) as caught:
    compile_many(reqs, cache=FileStreamProgramCache(sys.argv[1]), processes=True, max_workers=2)
print(json.dumps({"in_workers": pool().compiles, "warnings": [str(w.message) for w in caught]}))
""" % ARCH  # noqa: UP031 - the kernel source has braces of its own


@pytest.mark.parametrize("server", ["0", "1"])
def test_a_path_object_on_sys_path_does_not_keep_workers_from_starting(tmp_path, server) -> None:
    for n in range(2):  # with the server: the first process starts it, the second is served
        argv = [sys.executable, "-c", PATHLIB_CHILD, str(tmp_path / f"c{n}"), str(tmp_path)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "KERNELCACHE_COMPILE_SERVER": server})  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout.strip().splitlines()[-1]) == {"in_workers": 2, "warnings": []}
