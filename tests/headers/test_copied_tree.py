"""A header tree copied with its timestamps kept (cp -p, shutil.copytree, as tar and wheel
extraction do: whole-second mtimes, a fresh ctime) and compiled at once is stored on the first
compile and hit on the second, with no warning: nothing changed since the compile started.
Real copies on the test's own filesystem, real NVRTC."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import warnings

import pytest
from cuda.core import ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, KernelCacheWarning, compile_program

CODE = '#include "a.h"\nextern "C" __global__ void k(int* o) { o[0] = A + B; }\n'


@pytest.mark.parametrize("copy", ["cp -p", "copytree"])
def test_a_tree_copied_with_its_timestamps_is_stored_and_hit(tmp_path, monkeypatch, copy: str) -> None:
    src = tmp_path / "src" / "inc"
    src.mkdir(parents=True)
    (src / "a.h").write_text('#include "b.h"\n#define A 1\n')
    (src / "b.h").write_text("#define B 2\n")
    whole = (int(time.time()) - 3600) * 1_000_000_000  # an hour ago, a whole second
    for name in ("a.h", "b.h"):
        os.utime(src / name, ns=(whole, whole))
    dst = tmp_path / "dst"
    if copy == "cp -p":
        subprocess.run(["cp", "-pr", str(tmp_path / "src"), str(dst)], check=True)
    else:
        shutil.copytree(tmp_path / "src", dst)
    st = os.stat(dst / "inc" / "a.h")
    assert st.st_mtime_ns == whole and st.st_ctime_ns > whole  # the copy kept the mtime
    monkeypatch.chdir(tmp_path)
    settle_timestamps()  # one clock tick: the copy is done before the compile starts
    cache = FileStreamProgramCache(tmp_path / "cache")
    options = ProgramOptions(arch=ARCH, include_path=[str(dst / "inc")])
    infos = [CompileInfo(), CompileInfo()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for info in infos:
            compile_program(CODE, cache=cache, options=options, info=info)
    assert [w.message for w in caught if issubclass(w.category, KernelCacheWarning)] == []
    assert [(i.hit, i.cached) for i in infos] == [(False, True), (True, True)]
    assert sorted(infos[1].headers) == [str(dst / "inc" / "a.h"), str(dst / "inc" / "b.h")]
