"""A cache root proves it is one: destructive commands remove nothing elsewhere, reading
commands create nothing anywhere, and no command removes a file kernelcache did not write."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys

import pytest

from kernelcache.stores.file.marker import MARKER_NAME, has_marker, require_cache_root, write_marker
from kernelcache.stores.file.store import FORMAT_DIR, FileStreamProgramCache


def kc(*args: str, cache: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kernelcache", *args]
    if cache is not None:
        cmd += ["--cache-dir", cache]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL
    )


def tree(root: str) -> dict[str, bytes | None]:
    """Every path under root with its content (None for a directory)."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.relpath(os.path.join(dirpath, f), root)] = fh.read()
    return out


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _project(root: str) -> None:
    """A user's directory mistaken for a cache: a v1/ and a materialized/ of their own."""
    _write(os.path.join(root, "api", "v1", "routes.py"), b"ROUTES = []\n")
    _write(os.path.join(root, "v1", "routes.py"), b"v1 = True\n")
    _write(os.path.join(root, "v1", "entries", "ab", "notes.txt"), b"mine\n")
    _write(os.path.join(root, "materialized", "report.pdf"), b"%PDF")


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [("clear", "--yes"), ("prune", "--older-than", "0s"), ("prune", "--max-size", "0"), ("verify", "--fix")],
)
def test_destructive_commands_refuse_a_directory_that_is_not_a_cache(tmp_path, command) -> None:
    root = str(tmp_path / "project")
    _project(root)
    before = tree(root)
    line = _one_line(kc(*command, cache=root))
    assert "not a kernelcache cache root" in line or "no kernelcache cache" in line, line
    assert tree(root) == before  # nothing removed, nothing created (no v2/, no marker)


def test_destructive_commands_refuse_a_markerless_tree_they_cannot_judge(tmp_path) -> None:
    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        cache[b"k"] = b"value"
    os.unlink(os.path.join(root, MARKER_NAME))
    stray = os.path.join(root, FORMAT_DIR, "entries", "ab", "notes.txt")
    _write(stray, b"not an entry\n")
    line = _one_line(kc("clear", "--yes", cache=root))
    assert "refusing to clear" in line and stray in line, line
    assert os.path.exists(stray) and not has_marker(root)
    with FileStreamProgramCache(root) as cache:
        assert cache[b"k"] == b"value"


def test_a_tree_made_before_the_marker_is_adopted_when_it_is_all_ours(tmp_path) -> None:
    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        cache[b"k"] = b"value"
        cache[b"j"] = b"other"
    os.unlink(os.path.join(root, MARKER_NAME))
    out = kc("clear", "--yes", "--json", cache=root)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["removed"] == 2
    assert has_marker(root)


def test_the_tree_is_marked_when_created_and_another_tools_tag_is_kept(tmp_path) -> None:
    fresh = str(tmp_path / "fresh")
    FileStreamProgramCache(fresh).close()
    assert has_marker(fresh)
    assert write_marker(fresh) is False  # already there: one marker
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    tag = b"Signature: 8a477f597d28d172789f06886806bc55\n# created by some other tool\n"
    (theirs / MARKER_NAME).write_bytes(tag)
    FileStreamProgramCache(str(theirs)).close()
    assert (theirs / MARKER_NAME).read_bytes() == tag and not has_marker(str(theirs))
    with pytest.raises(ValueError, match="another tool"):
        require_cache_root(str(theirs), "clear")


def test_no_command_removes_a_file_it_did_not_write(tmp_path) -> None:
    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        cache[b"k"] = b"value"
    _project(root)
    # What layout v1 and the materialized copies really wrote: these go.
    name = "ab" + "0" * 62
    _write(os.path.join(root, "v1", "entries", "ab", name), b"old bytes")
    _write(os.path.join(root, "v1", "entries", "ab", name + ".meta"), b"kernelcache-sidecar 1 9 0 0 0\n{}")
    from kernelcache.integrations.materialized import materialize

    copy = materialize(root, "triton", "owner", "kern.cubin", b"cubin bytes")
    theirs = {
        p: c for p, c in tree(root).items() if p.startswith(("api", "v1/routes.py", "v1/entries/ab/notes", "materialized/report"))
    }
    # The copy and the copies' sweep stamp are kernelcache's own files; the rest are the user's.
    ours = (copy, os.path.join(root, "materialized", ".swept"))
    theirs = {p: c for p, c in theirs.items() if c is not None and os.path.join(root, p) not in ours}
    out = kc("clear", "--yes", "--json", cache=root)
    assert out.returncode == 0, out.stderr
    after = tree(root)
    assert {p: after.get(p) for p in theirs} == theirs  # every file of the user's is still there
    assert not os.path.exists(copy) and not os.path.exists(os.path.join(root, "v1", "entries", "ab", name))
    assert json.loads(out.stdout)["removed"] == 1
    _write(os.path.join(root, "v1", "entries", "ab", name), b"old bytes")
    _write(os.path.join(root, "v1", "entries", "ab", name + ".meta"), b"kernelcache-sidecar 1 9 0 0 0\n{}")
    assert kc("prune", "--older-than", "0s", cache=root).returncode == 0
    assert {p: tree(root).get(p) for p in theirs} == theirs
    assert not os.path.exists(os.path.join(root, "v1", "entries", "ab", name))


@pytest.mark.parametrize(
    "command",
    [
        ("stats",),
        ("ls",),
        ("show", "abcd"),
        ("export", "abcd", "-o", "-"),
        ("verify",),
        ("prune", "--dry-run", "--older-than", "1d"),
    ],
)
def test_reading_commands_create_nothing(tmp_path, command) -> None:
    # KERNELCACHE_DIR=/etc kernelcache stats made /etc/v2/...; a stand-in for /etc here.
    etc = str(tmp_path / "etc")
    _write(os.path.join(etc, "hosts"), b"127.0.0.1 localhost\n")
    before = tree(etc)
    proc = kc(*command, env={"KERNELCACHE_DIR": etc})
    assert "Traceback" not in proc.stderr
    if command[0] in ("show", "export"):
        assert "no entry with key prefix" in _one_line(proc)
    else:
        assert proc.returncode == 0, proc.stderr  # an empty cache: zeros, no entries
    assert tree(etc) == before


def test_explain_creates_nothing(tmp_path) -> None:
    etc = str(tmp_path / "etc")
    _write(os.path.join(etc, "hosts"), b"127.0.0.1 localhost\n")
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"kernel": [{"name": "k", "code": "__global__ void k() {}", "arch": "sm_90"}]}))
    before = tree(etc)
    proc = kc("explain", str(manifest), "--json", env={"KERNELCACHE_DIR": etc})
    assert proc.returncode == 1, proc.stderr  # not in the cache (there is none)
    assert json.loads(proc.stdout)["in_cache"] is False
    assert tree(etc) == before


def test_demo_clear_cache_removes_only_the_demos_entry(tmp_path) -> None:
    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        for i in range(5):
            cache[b"other program %d" % i] = b"kernel %d" % i
    args = ("demo", "--json", "--m", "16", "--n", "16", "--k", "16")
    first = kc(*args, cache=root)
    assert first.returncode == 0, first.stderr
    assert kc(*args, cache=root).returncode == 0
    cleared = kc(*args, "--clear-cache", cache=root)
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout)["cache_status"] == "MISS"
    with FileStreamProgramCache(root) as cache:
        assert [cache.get(b"other program %d" % i) for i in range(5)] == [b"kernel %d" % i for i in range(5)]
        assert len(cache) == 7  # the five, the demo's entry and its source index (explained misses)


def test_demo_clear_cache_refuses_a_tree_that_is_not_a_cache(tmp_path) -> None:
    root = str(tmp_path / "project")
    _write(os.path.join(root, FORMAT_DIR, "notes.txt"), b"mine\n")
    before = tree(root)
    line = _one_line(kc("demo", "--clear-cache", cache=root))
    assert "refusing to demo --clear-cache" in line, line
    assert tree(root) == before


# -- clear racing a writer ---------------------------------------------------------------------

_CLEARER = """
import fcntl, os, signal, sys
from kernelcache.stores.file.store import FileStreamProgramCache

shard = sys.argv[2]
seen = {"removed": 0, "opened": None, "stopped": False}


def stop_between_files(event, args):
    # Observes, changes nothing: the clearer stops itself (a real SIGSTOP) when it is about to
    # lock the shard for its second file. Then it has listed the shard, unlinked one file and
    # let go of the shard's pair lock: a writer can publish onto every path it has not reached.
    if seen["stopped"]:
        return
    if event == "os.remove" and os.path.dirname(os.fsdecode(args[0])) == shard:
        seen["removed"] += 1
    elif event == "open" and isinstance(args[0], (str, bytes)):
        seen["opened"] = os.fsdecode(args[0])
    elif event == "fcntl.flock" and args[1] & fcntl.LOCK_EX and seen["removed"] and seen["opened"] == shard:
        seen["stopped"] = True
        os.kill(os.getpid(), signal.SIGSTOP)


sys.addaudithook(stop_between_files)
FileStreamProgramCache(sys.argv[1]).clear()
assert seen["stopped"], "the clearer never locked the shard after its first unlink"
"""


def test_clear_removes_only_the_files_it_listed(tmp_path) -> None:
    # Race: clear lists a shard, then unlinks what it listed; a writer os.replace's a fresh
    # entry onto one of those paths in between. The clearer stops itself after its first
    # unlink, outside the shard's lock (an audit hook in the child: a real SIGSTOP at the
    # exact point, whatever the machine's load), every entry it has not reached yet is
    # replaced, and it goes on: the replaced files must survive (clear removes the file it
    # listed, not whatever is at its path).
    root = str(tmp_path / "c")
    FileStreamProgramCache(root).close()
    shard = os.path.join(root, FORMAT_DIR, "entries", "ab")
    os.makedirs(shard, mode=0o700)
    names = [f"ab{i:062x}" for i in range(20)]
    for n in names:
        _write(os.path.join(shard, n), b"old")
    proc = subprocess.Popen([sys.executable, "-c", _CLEARER, root, shard])
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            raise AssertionError(f"the clearer ended without stopping (exit {proc.returncode})")
        left = sorted(os.listdir(shard))
        assert len(left) == len(names) - 1 and set(left) < set(names)  # one unlinked, the rest not reached
        # A writer publishes under the shard's pair lock, as the store's writers do; the
        # clearer stopped outside it, so the lock is free.
        lock = os.open(shard, os.O_RDONLY)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            for n in left:
                tmp = os.path.join(root, FORMAT_DIR, "tmp", n + ".new")
                _write(tmp, b"fresh")
                os.replace(tmp, os.path.join(shard, n))  # a writer's publish: a new inode
        finally:
            os.close(lock)
    finally:
        proc.send_signal(signal.SIGCONT)  # nothing to send where it was reaped above
        proc.wait(timeout=120)
    assert proc.returncode == 0
    survived = sorted(os.listdir(shard))
    assert survived == left
    for n in survived:
        with open(os.path.join(shard, n), "rb") as f:
            assert f.read() == b"fresh"


def test_reading_commands_remove_nothing_either(tmp_path) -> None:
    root = str(tmp_path / "c")
    with FileStreamProgramCache(root) as cache:
        cache[b"k"] = b"value"
    # A dead writer's staged file (nobody holds its lock): maintenance removes it, reading does not.
    leftover = os.path.join(root, FORMAT_DIR, "tmp", "0" * 32 + ".tmp")
    _write(leftover, b"half a write")
    before = tree(root)
    for command in (("ls", "--json"), ("stats", "--json"), ("show", "ff"), ("verify", "--json")):
        kc(*command, cache=root)
        assert os.path.exists(leftover), command
    assert {p: c for p, c in tree(root).items() if c is not None and "stats" not in p} == {
        p: c for p, c in before.items() if c is not None and "stats" not in p
    }
    report = json.loads(kc("verify", "--json", cache=root).stdout)
    assert report["stale_temps"] == [leftover]
    assert kc("verify", "--fix", cache=root).returncode == 0
    assert not os.path.exists(leftover)


def test_a_directory_that_also_holds_a_users_files_is_never_tagged(tmp_path) -> None:
    # The tag makes backup tools (tar --exclude-caches, borg) skip the whole directory: a
    # user's project used as a cache directory must still be backed up, and is no cache root.
    root = str(tmp_path / "project")
    _write(os.path.join(root, "notes.txt"), b"mine\n")
    with FileStreamProgramCache(root) as cache:
        cache[b"k"] = b"value"
        assert cache[b"k"] == b"value"
    assert not os.path.exists(os.path.join(root, MARKER_NAME))
    line = _one_line(kc("clear", "--yes", cache=root))
    assert "notes.txt" in line and "refusing to clear" in line
    with FileStreamProgramCache(root) as cache:
        assert cache[b"k"] == b"value"
