"""compile_many in child processes (spawned: a real separate interpreter each)."""

from __future__ import annotations

import warnings

from startline import arrive


def variant(i: int) -> str:
    """A small kernel per index: distinct sources, distinct keys, fast compiles."""
    return f'extern "C" __global__ void scale{i}(float* a) {{ a[threadIdx.x] *= {i + 1}.0f; }}\n'


def compile_variants(
    root: str, arch: str, count: int, gate: str, parties: int, processes: bool | None = None
) -> list[bytes]:
    """compile_many of ``count`` variants on a shared cache dir, started together with the other
    ``parties`` (startline.arrive at ``gate``; ``processes``: compile_many's, compiles in worker
    processes or on threads)."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_many

    warnings.simplefilter("ignore")
    cache = FileStreamProgramCache(root)
    requests = [{"code": variant(i), "options": ProgramOptions(arch=arch)} for i in range(count)]
    arrive(gate, parties)  # every process starts at once: the worst case for sharing
    return [bytes(obj.code) for obj in compile_many(requests, cache=cache, max_workers=2, processes=processes)]


def compile_one_held(root: str, code: str, arch: str, started: object) -> None:
    """compile_program of ``code`` (a slow one), saying when it starts."""
    from cuda.core import ProgramOptions

    from kernelcache import FileStreamProgramCache, compile_program

    warnings.simplefilter("ignore")
    started.set()  # type: ignore[attr-defined]
    compile_program(
        code,
        options=ProgramOptions(arch=arch, use_bundled_headers=True, std="c++17"),
        cache=FileStreamProgramCache(root),
    )


def host_compile_many(root: str, url: str, namespace: str, count: int, gate: str, parties: int, arch: str) -> int:
    """One "host": its own memory and disk tiers, a shared Redis; compile_many; its compiles."""
    from cuda.core import ProgramOptions

    from kernelcache import (
        FileStreamProgramCache,
        InMemoryProgramCache,
        RedisProgramCache,
        TieredProgramCache,
        compile_many,
    )

    warnings.simplefilter("ignore")
    cache = TieredProgramCache(
        [InMemoryProgramCache(), FileStreamProgramCache(root), RedisProgramCache(url, namespace=namespace)]
    )
    requests = [{"code": variant(i), "options": ProgramOptions(arch=arch)} for i in range(count)]
    arrive(gate, parties)
    compile_many(requests, cache=cache, max_workers=2)
    return int(cache.stats()["compiles"])
