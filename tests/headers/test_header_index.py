"""A fresh process's hit re-proves only what can have changed: the cache's header index holds
each header's digest by its file's identity and each searched directory's entries by the
directory's, so a hit on a kernel with a real include tree reads no header and lists no
directory, while every real edit (a pre-include, the first include, a nested header, a file
that now shadows one, a same-size rewrite with its mtime put back) still misses.

Counts come from Python's audit events (``open``, ``os.scandir``) in fresh interpreters; real
NVRTC, real files, real processes, a real other uid.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

from helpers import ARCH, settle_timestamps

KERNEL = '#include "top.h"\nextern "C" __global__ void k(int* o) { o[0] = TOTAL + PRE; }\n'
CHILD = textwrap.dedent(
    """
    import hashlib, json, os, sys, warnings
    warnings.simplefilter("ignore")
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
    root, arch, tree = os.path.realpath(sys.argv[1]), sys.argv[2], os.path.realpath(sys.argv[3])
    code = sys.argv[4]
    options = ProgramOptions(arch=arch, include_path=[tree + "/inc1", tree + "/inc2"], pre_include=[tree + "/pre.h"])
    cache = FileStreamProgramCache(root)
    events = {"header_opens": 0, "index_opens": 0, "scandirs": 0}
    def hook(event, args):
        if event == "open" and isinstance(args[0], str):
            if args[0].startswith(tree):
                events["header_opens"] += 1
            elif "/index/" in args[0]:
                events["index_opens"] += 1
        elif event == "os.scandir" and str(args[0]).startswith(tree):
            events["scandirs"] += 1
    info = CompileInfo()
    sys.addaudithook(hook)
    obj = compile_program(code, cache=cache, options=options, info=info)
    print(json.dumps({"hit": info.hit, "sha": hashlib.sha256(bytes(obj.code)).hexdigest(),
                      "headers": len(info.headers), **events}))
    """
)

N_DIRS, PER_DIR = 6, 10  # 60 headers in 6 directories, chained: top.h includes them all


def _tree(root) -> None:
    inc1, inc2 = root / "inc1", root / "inc2"
    names = []
    for d in range(N_DIRS):
        sub = (inc1 if d % 2 else inc2) / f"d{d}"
        sub.mkdir(parents=True)
        for i in range(PER_DIR):
            name = f"d{d}/h{i}.h"
            (sub / f"h{i}.h").write_text(f"#define V_{d}_{i} {d * PER_DIR + i}\n")
            names.append(name)
    total = " + ".join(f"V_{n.split('/')[0][1:]}_{n.split('/h')[1][:-2]}" for n in names)
    (inc1 / "top.h").write_text("".join(f'#include "{n}"\n' for n in names) + f"#define TOTAL ({total})\n")
    (root / "pre.h").write_text("#define PRE 1\n")


def _child(root: str, tree: str, code: str = KERNEL) -> dict:
    args = [sys.executable, "-c", CHILD, root, ARCH, tree, code]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _truth(tree: str, code: str = KERNEL) -> str:
    """The sha256 of CHILD's kernel compiled now without kernelcache (a plain cuda.core compile,
    here: it needs no fresh process, only the same request)."""
    from cuda.core import Program, ProgramOptions

    tree = os.path.realpath(tree)
    options = ProgramOptions(arch=ARCH, include_path=[tree + "/inc1", tree + "/inc2"], pre_include=[tree + "/pre.h"])
    program = Program(code, "c++", options=options)
    try:
        return hashlib.sha256(bytes(program.compile("cubin").code)).hexdigest()
    finally:
        program.close()


def test_a_fresh_process_hit_reads_no_header_and_lists_no_directory(tmp_path) -> None:
    _tree(tmp_path / "tree")
    settle_timestamps()
    root, tree = str(tmp_path / "cache"), str(tmp_path / "tree")
    first = _child(root, tree)
    assert not first["hit"] and first["headers"] == N_DIRS * PER_DIR + 2
    warm = [_child(root, tree) for _ in range(2)]
    for got in warm:
        assert got["hit"] and got["sha"] == first["sha"]
        assert (got["header_opens"], got["scandirs"], got["index_opens"]) == (0, 0, 1), got


# KERNEL, and a header that only a dangling symlink names for now (a view's link to a file that
# its package does not have yet).
LINKED_KERNEL = (
    '#if __has_include("extra.h")\n#include "extra.h"\n#endif\n#ifndef EXTRA\n#define EXTRA 0\n#endif\n'
    + KERNEL.replace("TOTAL + PRE", "TOTAL + PRE + EXTRA")
)


def _view(real, view) -> None:
    """``view``: inc1/, inc2/ and pre.h of the tree ``real`` as symlinks to its entries (a
    Spack view, a Bazel execroot), and inc1/extra.h a link to a file ``real`` lacks."""
    for inc in ("inc1", "inc2"):
        (view / inc).mkdir(parents=True)
        for entry in os.listdir(real / inc):
            os.symlink(real / inc / entry, view / inc / entry)
    os.symlink(real / "pre.h", view / "pre.h")
    os.symlink(real / "inc1" / "extra.h", view / "inc1" / "extra.h")


def _proofs(root: str) -> dict:
    with open(os.path.join(root, "v2", "index", f"headers-{os.getuid()}.json")) as f:
        return json.load(f)["proofs"]


def test_a_view_of_symlinks_keeps_its_proof_and_a_link_whose_target_appears_misses(tmp_path) -> None:
    """Headers reached through symlink entries: no listing proves what a link names (its
    target can change elsewhere), so a fresh process proved every probe again (the H200
    host: 183 real kernels through such a tree, all hits, 309 ms against 45 ms through real
    files). The proof now keeps those places and asks each again by a stat; a dangling link
    whose target then appears, the view's directories untouched, is a miss, never the old entry."""
    real, view = tmp_path / "real", tmp_path / "view"
    _tree(real)
    _view(real, view)
    settle_timestamps()
    root = str(tmp_path / "cache")
    first = _child(root, str(view), LINKED_KERNEL)
    assert not first["hit"] and first["sha"] == _truth(str(view), LINKED_KERNEL)
    warm = _child(root, str(view), LINKED_KERNEL)
    assert warm["hit"] and warm["sha"] == first["sha"]
    kept = [p for p in _proofs(root).values() if len(p) == 3]
    assert len(kept) == 1, _proofs(root)  # the proof, with the places only a stat answers
    # Its headers (top.h, linked) are vouched for by their digests; the one probe that only a
    # stat answers is the dangling link.
    assert dict(kept[0][2]) == {str(view / "inc1" / "extra.h"): False}
    assert _child(root, str(view), LINKED_KERNEL)["hit"]  # the kept proof holds

    (real / "inc1" / "extra.h").write_text("#define EXTRA 40\n")  # the link's target appears
    settle_timestamps()
    got = _child(root, str(view), LINKED_KERNEL)
    assert not got["hit"] and got["sha"] == _truth(str(view), LINKED_KERNEL) != first["sha"]
    assert _child(root, str(view), LINKED_KERNEL)["hit"]


def _edit(path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def test_every_real_edit_still_misses_in_a_fresh_process(tmp_path) -> None:
    _tree(tmp_path / "tree")
    settle_timestamps()
    root, tree = str(tmp_path / "cache"), tmp_path / "tree"
    assert not _child(root, str(tree))["hit"]
    assert _child(root, str(tree))["hit"]
    edits = [
        ("pre-include", lambda: _edit(tree / "pre.h", "#define PRE 7\n")),
        ("first include", lambda: _edit(tree / "inc1" / "top.h", (tree / "inc1" / "top.h").read_text() + "\n")),
        ("nested", lambda: _edit(tree / "inc2" / "d2" / "h3.h", "#define V_2_3 999\n")),
        # inc1 comes first: a new inc1/d2/h4.h now shadows inc2/d2/h4.h (a directory that was absent)
        ("shadow", lambda: (tree / "inc1" / "d2").mkdir() or _edit(tree / "inc1" / "d2" / "h4.h", "#define V_2_4 5\n")),
    ]
    for what, edit in edits:
        edit()
        settle_timestamps()
        got = _child(root, str(tree))
        assert not got["hit"] and got["sha"] == _truth(str(tree)), what
        assert _child(root, str(tree))["hit"], what  # stored again, then a hit


def test_a_same_size_rewrite_with_its_mtime_put_back_misses(tmp_path) -> None:
    _tree(tmp_path / "tree")
    settle_timestamps()
    root, tree = str(tmp_path / "cache"), tmp_path / "tree"
    assert not _child(root, str(tree))["hit"]
    header = tree / "inc1" / "d1" / "h5.h"
    st = os.stat(header)
    _edit(header, "#define V_1_5 77\n")  # the same size as "#define V_1_5 15\n"
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))  # as before: only the ctime moved
    assert os.stat(header).st_size == st.st_size and os.stat(header).st_mtime_ns == st.st_mtime_ns
    settle_timestamps()
    got = _child(root, str(tree))
    assert not got["hit"] and got["sha"] == _truth(str(tree))


def test_another_users_index_is_never_read(tmp_path) -> None:
    _tree(tmp_path / "tree")
    settle_timestamps()
    root, tree = str(tmp_path / "cache"), str(tmp_path / "tree")
    _child(root, tree)
    index_dir = os.path.join(root, "v2", "index")
    (name,) = os.listdir(index_dir)
    os.chown(os.path.join(index_dir, name), 65534, 65534)  # as if another user wrote it
    got = _child(root, tree)
    assert got["hit"] and got["header_opens"] == N_DIRS * PER_DIR + 2  # proved from the files themselves


def test_a_directory_changing_while_it_is_listed_is_never_served_stale(tmp_path) -> None:
    # Race: a listing taken while entries come and go may miss one; it is used only when the
    # directory's identity is the same before and after the listing, and kept only when
    # that identity is safely in the past. One thread churns a name, the other keeps asking.
    import threading

    from kernelcache.headers.index import HeaderIndex

    d = tmp_path / "d"
    d.mkdir()
    for i in range(50):
        (d / f"f{i}.h").write_text("x\n")
    index = HeaderIndex(None, None)
    stop = threading.Event()

    def churn() -> None:
        n = 0
        while not stop.is_set():
            path = d / f"churn{n % 3}.h"
            path.write_text("y\n") if n % 2 else path.unlink(missing_ok=True)
            n += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(2000):
            index.is_file(str(d / "churn0.h"), {})
    finally:
        stop.set()
        worker.join()
    settle_timestamps()
    for i in range(3):
        path = str(d / f"churn{i}.h")
        assert index.is_file(path, {})[0] == os.path.isfile(path)
        if os.path.exists(path):
            os.unlink(path)
        else:
            _edit(path, "z\n")
        settle_timestamps()
        assert index.is_file(path, {})[0] == os.path.isfile(path)


PARALLEL = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore")
    from cuda.core import ProgramOptions
    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
    root, arch, tree, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    for round in range(3):
        for k in range(4):
            code = '#include "top.h"\\nextern "C" __global__ void k%d(int* o) { o[0] = TOTAL + %d; }\\n' % (k, n)
            compile_program(code, cache=FileStreamProgramCache(root),
                            options=ProgramOptions(arch=arch, include_path=[tree + "/inc1", tree + "/inc2"]))
    """
)


def test_processes_saving_the_index_at_once_lose_nothing_that_matters(tmp_path) -> None:
    # Race: each process merges the file's facts with its own and renames its copy over it;
    # a fact one of them learned can be lost (learned again later), the file is never torn.
    _tree(tmp_path / "tree")
    settle_timestamps()
    root, tree = str(tmp_path / "cache"), str(tmp_path / "tree")
    procs = [
        subprocess.Popen([sys.executable, "-c", PARALLEL, root, ARCH, tree, str(n)], stderr=subprocess.PIPE)
        for n in range(4)
    ]
    for p in procs:
        assert p.wait(300) == 0, p.stderr.read() if p.stderr else ""
    index_dir = os.path.join(root, "v2", "index")
    for name in os.listdir(index_dir):
        with open(os.path.join(index_dir, name)) as f:
            data = json.load(f)  # whole, never torn
        assert len(data["files"]) >= N_DIRS * PER_DIR + 1
    assert not _child(root, tree)["hit"]  # another source
    got = _child(root, tree)
    assert got["hit"] and (got["header_opens"], got["scandirs"]) == (0, 0)
