"""A store serves the pairs it verified from memory only while the entry file is that very file
(stores/file/payloads.py): real files, real damage in place, a real second process replacing or
removing the entry."""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_an_entry_damaged_in_place_with_its_mtime_put_back_is_never_served(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    cache["k"] = b"A" * 1000
    assert cache.get("k") == b"A" * 1000  # verified, and kept
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
    assert cache.get("k") == b"old" * 100
    _in_another_process(tmp_path, 'cache["k"] = b"new" * 100')  # a writer's os.replace: a new inode
    assert cache.get("k") == b"new" * 100
    _in_another_process(tmp_path, 'del cache["k"]')
    assert cache.get("k") is None


def test_what_a_store_keeps_in_memory_is_bounded(tmp_path) -> None:
    cache = FileStreamProgramCache(tmp_path)
    size = payloads.MAX_BYTES // 8 - 1000
    for n in range(20):  # 2.5 times the bound, each read once verified
        cache[f"k{n}"] = bytes([n]) * size
        assert cache.get(f"k{n}") == bytes([n]) * size
    assert 0 < cache._payloads._bytes <= payloads.MAX_BYTES
    big = b"x" * (payloads.MAX_ENTRY_BYTES + 1)
    cache["big"] = big
    assert cache.get("big") == big
    assert all(len(kept.payload) <= payloads.MAX_ENTRY_BYTES for kept in cache._payloads._kept.values())
