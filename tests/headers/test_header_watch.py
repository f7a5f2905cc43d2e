"""A process that hits the same kernel again trusts what it proved while the kernel reports no
change (headers.watch: inotify on the headers, the directories searched and the way to them),
so a repeated hit stats nothing; and every real change still misses at once, in that process:
an edit, a same-size rewrite with its mtime put back, a new file that shadows a header, a
renamed parent directory with another tree put in its place, a repointed symlink, a write
through a hard link elsewhere, and a change made by a forked child. Real files, real NVRTC.
"""

from __future__ import annotations

import os
import shutil

import pytest
from cuda.core import Program, ProgramOptions
from helpers import ARCH, settle_timestamps

from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
from kernelcache.headers import index as header_index
from kernelcache.headers import watch

CODE = '#include "top.h"\nextern "C" __global__ void k(int* o) { o[0] = TOP + NEST; }\n'


def _tree(base, nest: int = 2) -> None:
    (base / "inc" / "sub").mkdir(parents=True)
    (base / "inc" / "top.h").write_text('#include "sub/nest.h"\n#define TOP 3\n')
    (base / "inc" / "sub" / "nest.h").write_text(f"#define NEST {nest}\n")


@pytest.fixture()
def project(tmp_path, monkeypatch):
    if watch.watcher() is None:
        pytest.skip("no inotify here")
    base = tmp_path / "deep" / "x"  # nothing above the project is searched: only watched on the way
    (base / "proj").mkdir(parents=True)
    _tree(base / "proj")
    (base / "proj" / "early").mkdir()
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    settle_timestamps()
    return base


def _options(root) -> ProgramOptions:
    return ProgramOptions(arch=ARCH, include_path=[str(root / "proj" / "early"), str(root / "proj" / "inc")])


def _compile(root, cache) -> tuple[bool, bytes]:
    settle_timestamps()
    info = CompileInfo()
    obj = compile_program(CODE, cache=cache, options=_options(root), info=info)
    return info.hit, bytes(obj.code)


def _truth(root) -> bytes:
    program = Program(CODE, "c++", options=_options(root))
    try:
        return bytes(program.compile("cubin").code)
    finally:
        program.close()


def _warm(root, cache) -> None:
    assert not _compile(root, cache)[0]
    assert _compile(root, cache)[0]
    assert _compile(root, cache)[0]
    index = header_index.for_store(cache)
    assert index.watched_variants, "the repeated hit was not proved under watch (a filesystem without inotify?)"


def _swap_parent(root) -> None:
    # A directory two levels above the include tree renamed away, another tree (NEST 9) put
    # at the same path: no watched directory itself moved, what the paths name did.
    os.rename(root, root.parent / "x.old")
    (root / "proj").mkdir(parents=True)
    _tree(root / "proj", nest=9)
    (root / "proj" / "early").mkdir()


def _repoint(root) -> None:
    # inc is a symlink to one tree; repointed (as ln -sfn does) to another.
    shutil.move(root / "proj" / "inc", root / "tree1")
    _tree(root / "t2", nest=7)
    os.symlink(root / "tree1", root / "proj" / "inc")


CHANGES = {
    "edit": lambda root: (root / "proj" / "inc" / "sub" / "nest.h").write_text("#define NEST 20\n"),
    "same-size, mtime put back": None,  # below
    "shadow": lambda root: (root / "proj" / "early" / "top.h").write_text("#define TOP 5\n#define NEST 1\n"),
    "parent swapped": _swap_parent,
    "hard link": None,  # below
    "symlink repointed": None,  # below
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_every_change_misses_at_once_in_the_same_process(project, change: str) -> None:
    root = project
    if change == "symlink repointed":
        _repoint(root)
    if change == "hard link":
        os.link(root / "proj" / "inc" / "sub" / "nest.h", root / "elsewhere.h")
    cache = FileStreamProgramCache(root.parent.parent / "cache")
    _warm(root, cache)
    if change == "same-size, mtime put back":
        nest = root / "proj" / "inc" / "sub" / "nest.h"
        st = os.stat(nest)
        nest.write_text("#define NEST 5\n")
        os.utime(nest, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "hard link":
        with open(root / "elsewhere.h", "w") as f:  # the same inode, through another directory
            f.write("#define NEST 40\n")
    elif change == "symlink repointed":
        os.unlink(root / "proj" / "inc")
        os.symlink(root / "t2" / "inc", root / "proj" / "inc")
    else:
        CHANGES[change](root)
    hit, got = _compile(root, cache)
    assert not hit
    assert got == _truth(root)
    assert _compile(root, cache)[0]  # and then a hit again, of the new bytes
    assert _compile(root, cache)[1] == got


def test_a_forked_childs_change_misses_in_the_child_and_in_the_parent(project) -> None:
    root = project
    cache = FileStreamProgramCache(root.parent.parent / "cache")
    _warm(root, cache)
    pid = os.fork()
    if pid == 0:  # the child: its own look-ups, none of the parent's trust
        code = 1
        try:
            (root / "proj" / "inc" / "sub" / "nest.h").write_text("#define NEST 11\n")
            hit, got = _compile(root, cache)
            code = 0 if (not hit and got == _truth(root)) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    hit, got = _compile(root, cache)
    assert hit and got == _truth(root)  # the child stored the new bytes; the parent sees the change


OTHER = '#include "top.h"\nextern "C" __global__ void other(int* o) { o[1] = TOP * NEST; }\n'


@pytest.mark.parametrize("change", ["edit", "shadow"])
def test_a_change_between_two_kernels_misses_the_next_kernel_that_reads_it(project, change: str) -> None:
    """What one kernel's look-up proved under watch is trusted by another kernel's first look-up in
    the process (they share the headers); a change in between misses that other kernel at once,
    with the bytes a plain compile gives."""
    root = project
    cache = FileStreamProgramCache(root.parent.parent / "cache")
    info = CompileInfo()
    compile_program(OTHER, cache=cache, options=_options(root), info=info)
    assert not info.hit and info.cached
    _warm(root, cache)  # CODE: a miss, then hits proved under watch (shared top.h and nest.h)
    CHANGES[change](root)
    settle_timestamps()
    info = CompileInfo()
    got = bytes(compile_program(OTHER, cache=cache, options=_options(root), info=info).code)
    program = Program(OTHER, "c++", options=_options(root))
    try:
        truth = bytes(program.compile("cubin").code)
    finally:
        program.close()
    assert not info.hit and got == truth


def test_past_its_share_of_watches_a_process_proves_by_stat_and_still_misses_an_edit(project, monkeypatch) -> None:
    """A process stops adding watches at its share of the user's inotify limit: what it could not
    watch is proved by stat on every look-up, so an edit still misses at once."""
    root = project
    w = watch.watcher()
    monkeypatch.setattr(w, "max_watches", len(w._names) + 3)  # a few: not the whole way to every header
    cache = FileStreamProgramCache(root.parent.parent / "cache")
    assert not _compile(root, cache)[0]
    assert _compile(root, cache)[0] and _compile(root, cache)[0]
    assert len(w._names) <= w.max_watches
    CHANGES["edit"](root)
    hit, got = _compile(root, cache)
    assert not hit and got == _truth(root)
