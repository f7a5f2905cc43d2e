"""A header reached by ".." after a symlink: inc/sub -> a release's sub/, whose a.h includes
"../val.h". NVRTC opens inc/sub/../val.h, which the kernel resolves from the link's target (the
release's val.h), not lexically (inc/val.h, here a decoy with another value). A header path
normalised lexically vouched for the decoy: after an edit of the release's val.h, or with the
link repointed to another release, a fresh process's hit returned the old kernel. Each check
runs in a fresh process against a plain compile of the same request.
"""

from __future__ import annotations

import json
import os

from helpers import ARCH, run_python, settle_timestamps

CHILD = """
import json, sys, warnings
warnings.simplefilter("ignore")
from cuda.core import Program, ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
inc, root, arch = sys.argv[1:4]
source = '#include "sub/a.h"\\nextern "C" __global__ void k(float* o) { o[0] = VAL; }\\n'
options = ProgramOptions(arch=arch, include_path=[inc])
info = CompileInfo()
got = compile_program(source, options=options, cache=FileStreamProgramCache(root), info=info)
truth = Program(source, "c++", options=options).compile("cubin")
print(json.dumps({"hit": info.hit, "same": bytes(got.code) == bytes(truth.code), "headers": info.headers}))
"""


def layout(tmp_path) -> tuple[str, str]:
    """(include dir, cache root): inc/sub -> r1/sub; r1/val.h and r2/val.h differ, inc/val.h is a decoy."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "val.h").write_text("#define VAL 9.0f\n")
    for release, value in (("r1", "1.0f"), ("r2", "2.0f")):
        (tmp_path / release / "sub").mkdir(parents=True)
        (tmp_path / release / "val.h").write_text(f"#define VAL {value}\n")
        (tmp_path / release / "sub" / "a.h").write_text('#include "../val.h"\n')
    os.symlink(tmp_path / "r1" / "sub", inc / "sub")
    return str(inc), str(tmp_path / "cache")


def fresh(inc: str, root: str) -> dict:
    settle_timestamps()
    return json.loads(run_python(CHILD, inc, root, ARCH, timeout=300).strip().splitlines()[-1])


def test_a_header_behind_a_symlink_and_dotdot_is_the_one_nvrtc_read(tmp_path) -> None:
    inc, root = layout(tmp_path)
    first = fresh(inc, root)
    assert first["hit"] is False and first["same"]
    assert os.path.join(inc, "sub", "..", "val.h") in first["headers"]  # as NVRTC opened it
    (tmp_path / "r1" / "val.h").write_text("#define VAL 3.0f\n")  # the file that was compiled
    assert fresh(inc, root) == {**first, "same": True, "hit": False}
    assert fresh(inc, root)["hit"] is True  # and stored again


def test_a_symlink_repointed_between_processes_is_a_miss(tmp_path) -> None:
    inc, root = layout(tmp_path)
    assert fresh(inc, root)["same"]
    os.remove(os.path.join(inc, "sub"))
    os.symlink(tmp_path / "r2" / "sub", os.path.join(inc, "sub"))  # the same a.h, another ../val.h
    after = fresh(inc, root)
    assert (after["hit"], after["same"]) == (False, True)
