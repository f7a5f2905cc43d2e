"""A store serves the pairs it verified from memory only while the entry file is that very file
(stores/file/payloads.py): real files, real damage in place, a real second process replacing or
removing the entry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from kernelcache import FileStreamProgramCache, KernelCacheWarning
from kernelcache.stores.file import payloads
from kernelcache.stores.naming import entry_name


def _entry(root, key: str) -> str:
    name = entry_name(key.encode())
    return os.path.join(root, "v2", "entries", name[:2], name)


def _in_another_process(root, code: str) -> None:
    script = f"from kernelcache import FileStreamProgramCache\ncache = FileStreamProgramCache({str(root)!r})\n{code}\n"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)


def _past_the_racy_window() -> None:
    # Entries written just now are not kept yet: the racy rule (kernelcache.timestamps) waits
    # for the clock to pass their timestamps, one tick (1-10 ms).
    time.sleep(0.1)


def test_an_entry_damaged_in_place_with_its_mtime_put_back_is_never_served(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"A" * 1000
    _past_the_racy_window()
    assert cache.get("k") == b"A" * 1000  # verified, and kept
    assert cache._payloads._kept
    path = _entry(tmp_path, "k")
    st = os.stat(path)
    with open(path, "r+b") as f:  # same inode, same size
        f.seek(500)
        f.write(b"B")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: only the ctime tells
    assert os.stat(path).st_mtime_ns == st.st_mtime_ns and os.stat(path).st_ino == st.st_ino
    with pytest.warns(KernelCacheWarning, match="integrity check"):
        assert cache.get("k") is None
        assert cache.get("k") is None
    assert not os.path.exists(path)


def test_an_entry_another_process_replaced_or_removed_is_read_again(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"old" * 100
    _past_the_racy_window()
    assert cache.get("k") == b"old" * 100
    assert cache._payloads._kept
    _in_another_process(tmp_path, 'cache["k"] = b"new" * 100')  # a writer's os.replace: a new inode
    assert cache.get("k") == b"new" * 100
    _in_another_process(tmp_path, 'del cache["k"]')
    assert cache.get("k") is None


def test_what_a_store_keeps_in_memory_is_bounded(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    size = payloads.MAX_BYTES // 8 - 1000
    for n in range(20):  # 2.5 times the bound
        cache[f"k{n}"] = bytes([n]) * size
    big = b"x" * (payloads.MAX_ENTRY_BYTES + 1)
    cache["big"] = big
    _past_the_racy_window()
    for n in range(20):  # each read once verified
        assert cache.get(f"k{n}") == bytes([n]) * size
        assert 0 < cache._payloads._bytes <= payloads.MAX_BYTES
    assert cache.get("big") == big
    assert all(len(kept.payload) <= payloads.MAX_ENTRY_BYTES for kept in cache._payloads._kept.values())


@pytest.fixture
def one_second_fs(tmp_path):
    """A real ext4 with 128-byte inodes (timestamps in whole seconds, as on ext3, HFS+ or some NFS
    servers), loop-mounted; skipped where this process may not make and mount one."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("mkfs.ext4", "mount", "umount")):
        pytest.skip("needs root, mkfs.ext4 and mount to make a file system with one-second timestamps")
    image, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(image, "wb") as f:
        f.truncate(64 * 2**20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", "-I", "128", str(image)], capture_output=True)
    mounted = made.returncode == 0 and subprocess.run(
        ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True
    )
    if not mounted or mounted.returncode != 0:
        pytest.skip("cannot make or loop-mount a file system here")
    try:
        yield mnt
    finally:
        # Lazy: the stores this test made may still hold their counters file open.
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_an_inode_reused_within_a_timestamp_tick_is_never_taken_for_the_file_verified(one_second_fs) -> None:
    # Two rewrites of one key within a second: the second one's staged file may get the first
    # one's freed inode, with the same size, mtime and ctime (whole seconds here; one kernel
    # tick, 1-10 ms, on a kernel with coarse timestamps). Before, the store served the bytes of
    # the first from memory (1992 of 2000 tries, found by an adversarial pass).
    wrong = []
    for n in range(106):
        root = one_second_fs / f"c{n}"
        cache = FileStreamProgramCache(root, max_size_bytes=None)
        cache[b"k"] = b"OLD-VALUE"
        assert cache[b"k"] == b"OLD-VALUE"
        cache[b"k"] = b"MID-VALUE"
        if n < 100:
            cache[b"k"] = b"NEW-VALUE"  # this process's own rewrite
        else:
            _in_another_process(root, 'cache[b"k"] = b"NEW-VALUE"')  # another process's
        if cache[b"k"] != b"NEW-VALUE":
            wrong.append(n)
    assert wrong == []


def test_many_small_entries_with_large_metadata_stay_within_the_bound(tmp_path) -> None:
    # The adversarial pass's case: 16-byte payloads carrying 8 kB logs, counted by payload alone
    # before (12,000 of them: 104 MiB of memory against 192 kB counted).
    cache = FileStreamProgramCache(tmp_path, max_size_bytes=None)
    for n in range(5000):
        cache.set_record(b"k%d" % n, b"P" * 16, {"log": "x" * 8000})
    _past_the_racy_window()
    for n in range(5000):
        assert cache.get_record(b"k%d" % n) is not None
        assert len(cache._payloads._kept) <= payloads.MAX_ENTRIES
        assert cache._payloads._bytes <= payloads.MAX_BYTES
