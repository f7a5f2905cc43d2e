"""The compile server's name (compile/fingerprint.py): what a worker takes from the process that
starts it must be in it, so that a process never gets a worker built for another environment.
Real servers, real child processes, a real chroot."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ARCH
from test_compile_server import CHILD, child, served
from test_compile_server import server_dir as server_dir  # the fixture: a runtime dir of the test's

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
