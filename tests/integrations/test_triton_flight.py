"""kernelcache as Triton's cache manager: one compile per kernel across processes (single flight,
as compile_program's), and a module Triton builds (a launcher) loaded from one path, as Triton's
own test_build.py::test_compile_module asks of a cache manager. Real Triton (its CPU wheel:
triton.compile for sm_90 needs no GPU), real processes, a real C compiler where there is one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import support_script

pytest.importorskip("triton")

MANAGER = "kernelcache.triton:KernelCacheManager"
MODULE_C = r"""
#include <Python.h>
static PyObject* answer(PyObject* self, PyObject* args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "kc_probe_module", NULL, -1, methods};
PyMODINIT_FUNC PyInit_kc_probe_module(void) { return PyModule_Create(&def); }
"""
BUILD = (
    "import json, sys\n"
    "from triton.runtime.build import compile_module_from_src\n"
    "first = compile_module_from_src(sys.argv[1], 'kc_probe_module')\n"
    "again = compile_module_from_src(sys.argv[1], 'kc_probe_module')\n"
    "print(json.dumps([first.__file__, again.__file__, again.answer()]))\n"
)


def _env(root: Path) -> dict[str, str]:
    support = os.path.dirname(support_script("helpers.py"))
    return {
        **os.environ,
        "KERNELCACHE_DIR": str(root / "kc"),
        "TRITON_CACHE_DIR": str(root / "triton-own"),  # must stay unused
        "TRITON_CACHE_MANAGER": MANAGER,
        "TRITON_DEFAULT_FP_FUSION": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (support, os.environ.get("PYTHONPATH")) if p),
    }


def _compiler_and_headers() -> bool:
    include = sysconfig.get_paths()["include"]
    return bool(shutil.which("gcc") or shutil.which("cc")) and os.path.exists(os.path.join(include, "Python.h"))


@pytest.mark.skipif(not _compiler_and_headers(), reason="needs a C compiler and Python's headers (Triton builds a module)")
def test_a_module_triton_builds_is_loaded_from_one_path_in_every_process(tmp_path: Path) -> None:
    """compile_module_from_src twice, in two processes: the second call of each is a cache hit
    loaded from the path the first got (before: the first got this process's scratch copy, the
    second the shared one; Triton's test_compile_module asserts the two paths are one)."""
    env = _env(tmp_path)
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", BUILD, MODULE_C], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    (first, again, answer), (other, other_again, _) = runs
    assert first == again == other == other_again and answer == 42
    assert os.path.exists(first) and not (tmp_path / "triton-own").exists()


def test_one_kernel_asked_by_three_processes_at_once_is_compiled_once(tmp_path: Path) -> None:
    """Three processes compile the same Triton kernel at the same moment: one compiles, the
    others wait for it and load its group (before: each compiled its own)."""
    env, gate = _env(tmp_path), tmp_path / "gate"  # they compile together once all three imported Triton
    procs = [
        subprocess.Popen(
            [sys.executable, support_script("_triton_flight_child.py"), str(gate), "128", "3"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["compiled"] for r in results) == 1, results
    assert sum(r["hits"] for r in results) == 2, results
    locks = tmp_path / "kc" / "v2" / "locks"
    assert not locks.exists() or [p.name for p in locks.iterdir()] == []  # no lock file left per kernel


def test_a_leader_that_never_stores_lets_the_others_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manager that missed (and so leads the kernel's flight) and is dropped without put_group,
    as when Triton's compile raises: the flight is let go at once, its lock file removed."""
    import gc

    from triton.runtime.cache import get_cache_manager

    from kernelcache.integrations import triton_files

    monkeypatch.setenv("KERNELCACHE_DIR", str(tmp_path / "kc"))
    monkeypatch.setenv("TRITON_CACHE_MANAGER", MANAGER)
    key = "ab" * 32
    manager = get_cache_manager(key)
    assert manager.get_group("k.json") is None and triton_files._held
    locks = tmp_path / "kc" / "v2" / "locks"
    assert len(list(locks.iterdir())) == 1  # held: the kernel's lock file
    del manager
    gc.collect()
    assert not triton_files._held and list(locks.iterdir()) == []
    # Another process leads it now (one try of each lock: a flight still held would say busy).
    code = (
        "import hashlib\nfrom kernelcache.compile.flight import SingleFlight\n"
        "from kernelcache.integrations.triton_files import TritonFiles\n"
        "from kernelcache.stores.default import default_cache\n"
        f"files = TritonFiles({key!r}, default_cache())\n"
        "key = hashlib.sha256(files._group_key('k.json')).digest()\n"
        "with SingleFlight.for_store(default_cache(), key).try_hold() as outcome:\n    print(outcome)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=os.environ, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "acquired", out.stderr


_FIFO_MEMBER = """
import os, signal, sys, warnings
signal.alarm(20)  # a read that waits on the FIFO ends the process, failing the test, instead of hanging it
from triton.runtime.cache import get_cache_manager
fifo = sys.argv[1]
os.mkfifo(fifo)
m = get_cache_manager("cd" * 32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m.put_group("k.json", {"k.cubin": fifo, "k.json": m.put(b"{}", "k.json")})
print(m.get_group("k.json") is None, any("k.cubin" in str(w.message) or fifo in str(w.message) for w in caught))
"""


def test_a_fifo_at_a_group_members_path_is_refused_never_waited_on(tmp_path: Path) -> None:
    """put_group reads the members Triton names by path; a FIFO there (planted, or a tool's) is
    refused at once, the group not stored, one warning (before: the read waited forever)."""
    out = subprocess.run(
        [sys.executable, "-c", _FIFO_MEMBER, str(tmp_path / "member.fifo")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True"]
