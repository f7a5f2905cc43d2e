"""A symlink on a header's path repointed while the compile runs: ``ln -sfn`` on the header itself,
or a deploy's ``current`` link to an SDK switched to another release. Both targets are old files,
so the header's own timestamps (stat follows the link) say nothing changed: only the link's do.
NVRTC read the old target, the variant was hashed from the new one; the check after the compile
(headers.digests.changed_during) must refuse to store, or a fresh process's hit on the new
target returns the old target's kernel. Found by an adversarial pass (wrong bytes, in a fresh
process, before the fix). The same with a compile that skips its header pass (compile.tracing):
the link moves after the rebuild beside the compile and before NVRTC's look-up. And a real
directory renamed onto the way (``mv``), refused by its own stamps.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings
from collections.abc import Callable

from cuda.core import ProgramOptions
from helpers import ARCH, run_python, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program

# About 2 s of NVRTC front end (constexpr evaluation) on either side of the include: the header is
# read at once (SPIN_AFTER) or after it (SPIN_BEFORE), and the link moves 0.5 s into the compile.
SPIN = "\n".join(f'static_assert(spin({500000 + i}) != 1, "");' for i in range(10))
SPIN_FN = (
    "__device__ constexpr unsigned spin(unsigned n)"
    " { unsigned s = 0; for (unsigned i = 0; i < n; ++i) s += i ^ (s >> 3); return s; }\n"
)
KERNEL = "template <int N> __global__ void k(float* o) { o[threadIdx.x] = VAL * N; }\n"
SPIN_AFTER = '#include "val.h"\n' + SPIN_FN + SPIN + "\n" + KERNEL
SPIN_BEFORE = SPIN_FN + SPIN + '\n#include "val.h"\n' + KERNEL

FRESH = """
import json, sys, warnings
warnings.simplefilter("ignore")
from cuda.core import Program, ProgramOptions
from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
source, inc, root, name, arch = sys.argv[1:6]
options = ProgramOptions(arch=arch, include_path=[inc])
info = CompileInfo()
got = compile_program(source, options=options, cache=FileStreamProgramCache(root), name_expressions=[name], info=info)
truth = Program(source, "c++", options=options).compile("cubin", name_expressions=[name])
print(json.dumps({"hit": info.hit, "same": bytes(got.code) == bytes(truth.code)}))
"""


def repoint(link: str, target: str) -> None:
    """``ln -sfn target link``: a new link renamed over the old one (atomic)."""
    staged = link + ".new"
    os.symlink(target, staged)
    os.replace(staged, link)


def compiled(cache: FileStreamProgramCache, source: str, inc: str, name: str) -> CompileInfo:
    info = CompileInfo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile_program(
            source,
            cache=cache,
            info=info,
            options=ProgramOptions(arch=ARCH, include_path=[inc]),
            name_expressions=[name],
        )
    return info


def during(action: Callable[[], None], compile_: Callable[[], CompileInfo]) -> CompileInfo:
    """``compile_()`` with ``action`` run 0.5 s into it, on another thread."""
    settle_timestamps()  # every file and link made so far is older than the compile's start
    mover = threading.Thread(target=lambda: (time.sleep(0.5), action()))
    mover.start()
    try:
        return compile_()
    finally:
        mover.join()


def fresh(source: str, inc: str, root: str, name: str) -> dict:
    """A fresh process (no memo of this one) compiling the same: hit, and bytes equal a plain compile."""
    settle_timestamps()
    return json.loads(run_python(FRESH, source, inc, root, name, ARCH, timeout=300).strip().splitlines()[-1])


def linked_header(tmp_path):  # noqa: ANN001, ANN201 - (include dir, cache root)
    """inc/val.h -> one.h (VAL 1), beside two.h (VAL 2); and where the cache goes."""
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "one.h").write_text("#define VAL 1.0f\n")
    (inc / "two.h").write_text("#define VAL 2.0f\n")
    os.symlink("one.h", inc / "val.h")
    return inc, str(tmp_path / "cache")


def test_a_header_symlink_repointed_during_the_compile_is_not_stored(tmp_path) -> None:
    inc, root = linked_header(tmp_path)
    info = during(
        lambda: repoint(str(inc / "val.h"), "two.h"),
        lambda: compiled(FileStreamProgramCache(root), SPIN_AFTER, str(inc), "k<1>"),
    )
    assert not info.hit and not info.cached and "replaced during the compile" in info.not_stored
    assert fresh(SPIN_AFTER, str(inc), root, "k<1>") == {"hit": False, "same": True}


def test_an_include_directory_switched_during_the_compile_is_not_stored(tmp_path) -> None:
    sdk = tmp_path / "sdk"
    for release, value in (("v1", "1.0f"), ("v2", "2.0f")):
        (sdk / release).mkdir(parents=True)
        (sdk / release / "val.h").write_text(f"#define VAL {value}\n")
    os.symlink("v1", sdk / "current")
    inc, root = str(sdk / "current"), str(tmp_path / "cache")
    info = during(
        lambda: repoint(str(sdk / "current"), "v2"),
        lambda: compiled(FileStreamProgramCache(root), SPIN_AFTER, inc, "k<1>"),
    )
    assert not info.hit and not info.cached and "replaced during the compile" in info.not_stored
    assert fresh(SPIN_AFTER, inc, root, "k<1>") == {"hit": False, "same": True}


def test_an_include_directory_renamed_over_during_the_compile_is_not_stored(tmp_path) -> None:
    """The same without a link: ``mv v1 old && mv v2 v1``. The directory now at sdk/v1 was
    renamed there (its ctime moved, its mtime did not): refused by its stamps."""
    sdk = tmp_path / "sdk"
    for release, value in (("v1", "1.0f"), ("v2", "2.0f")):
        (sdk / release).mkdir(parents=True)
        (sdk / release / "val.h").write_text(f"#define VAL {value}\n")
    inc, root = str(sdk / "v1"), str(tmp_path / "cache")

    def swap() -> None:
        os.rename(sdk / "v1", sdk / "old")
        os.rename(sdk / "v2", sdk / "v1")

    info = during(swap, lambda: compiled(FileStreamProgramCache(root), SPIN_AFTER, inc, "k<1>"))
    assert not info.hit and not info.cached and "renamed or replaced during the compile" in info.not_stored
    assert fresh(SPIN_AFTER, inc, root, "k<1>") == {"hit": False, "same": True}


def test_a_symlink_repointed_during_a_compile_without_a_pass_is_not_stored(tmp_path) -> None:
    inc, root = linked_header(tmp_path)
    cache = FileStreamProgramCache(root)
    settle_timestamps()
    assert compiled(cache, SPIN_BEFORE, str(inc), "k<1>").header_pass  # the pass: val.h -> one.h
    info = during(lambda: repoint(str(inc / "val.h"), "two.h"), lambda: compiled(cache, SPIN_BEFORE, str(inc), "k<2>"))
    assert not info.header_pass and not info.cached and "replaced during the compile" in info.not_stored
    repoint(str(inc / "val.h"), "one.h")  # back to the file the remembered variant names
    assert fresh(SPIN_BEFORE, str(inc), root, "k<2>") == {"hit": False, "same": True}
