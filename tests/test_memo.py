"""memo.is_instance: a remembered yes never answers for an object that is not an instance.

A proxy (weakref.proxy here) has one type for whatever it stands for, and isinstance of an ABC
looks at its ``__class__``: after a proxy of one of our stores, a proxy of cuda.core's cache must
still be taken as cuda.core's (wrapped), and compile as it would without the memo. In a fresh
interpreter: the memo is per process.
"""

from __future__ import annotations

import textwrap

from helpers import run_python

CHILD = textwrap.dedent(
    """
    import os, sys, weakref
    from cuda.core import ProgramOptions
    from cuda.core.utils import InMemoryProgramCache
    from kernelcache import CompileInfo, FileStreamProgramCache, compile_program
    from kernelcache.memo import is_instance
    from kernelcache.stores.base import ProgramCacheResource

    source = 'extern "C" __global__ void k(float* o) { o[0] = 1; }'
    options = ProgramOptions(arch="sm_90")
    ours = FileStreamProgramCache(os.path.join(sys.argv[1], "ours"))
    compile_program(source, options=options, cache=weakref.proxy(ours))
    theirs = InMemoryProgramCache()
    infos = [CompileInfo(), CompileInfo()]
    for info in infos:  # a miss stored in cuda.core's cache, then a hit from it
        compile_program(source, options=options, cache=weakref.proxy(theirs), info=info)
    print([i.hit for i in infos], is_instance(weakref.proxy(theirs), ProgramCacheResource))
    """
)


def test_a_proxy_of_another_kind_is_not_answered_by_an_earlier_proxys_yes(tmp_path) -> None:
    out = run_python(CHILD, str(tmp_path)).strip().splitlines()[-1]
    assert out == "[False, True] False"
