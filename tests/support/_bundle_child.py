"""A fresh process that serves compile_program from one bundle and reports what it did.

Usage: python _bundle_child.py BUNDLE SPEC_JSON [UID GID]

Everything that lives under the interpreter's own tree is loaded first (cuda.core,
kernelcache's compile path, the toolchain identity, the config file, NVRTC): with UID given the process then drops
to that user, who cannot read root's Python installation, and opens the bundle as them.
Prints JSON: hits per source, compiles, the files opened outside the interpreter's tree,
directories made, locks taken, warnings, and each artifact's SHA-256 and symbol mapping.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings

from cuda.core import Program, ProgramOptions

import kernelcache
import kernelcache.compile.flow
import kernelcache.config
import kernelcache.stores.bundle.store
from kernelcache.keys.toolchain import toolchain_for


def compile_item(item: dict, cache: kernelcache.ProgramCacheResource) -> tuple:
    """(ObjectCode, CompileInfo) of compile_program for one SPEC item."""
    info = kernelcache.CompileInfo()
    obj = kernelcache.compile_program(
        item["code"],
        options=ProgramOptions(arch=item["arch"]),
        name_expressions=item.get("names", ()),
        cache=cache,
        info=info,
    )
    return obj, info


def _import_every_module() -> None:
    # A hit imports only what a hit runs; the miss of a damaged entry imports the rest later,
    # when this process may no longer read the tree: every module now (optional extras aside).
    import importlib
    import pkgutil

    for module in pkgutil.walk_packages(kernelcache.__path__, "kernelcache."):
        if module.name.endswith("__main__"):
            continue  # the command line, which runs when imported
        try:
            importlib.import_module(module.name)
        except ImportError:
            pass  # an integration whose extra (cupy, triton, torch, dask) is not installed


def main() -> None:
    bundle, spec = sys.argv[1], json.loads(sys.argv[2])
    _import_every_module()
    toolchain_for("c++")
    kernelcache.config.check()  # reads the config file (platformdirs finds where) while it can
    # NVRTC and its builtins library are loaded now too, for the miss of a damaged entry.
    Program('extern "C" __global__ void warm() {}', "c++", ProgramOptions(arch="sm_90")).compile("cubin")
    if len(sys.argv) > 3:
        os.setgroups([])
        os.setgid(int(sys.argv[4]))
        os.setuid(int(sys.argv[3]))
    roots = tuple(p for p in {sys.prefix, sys.base_prefix, *sys.path} if p) + ("/proc", "/sys", "/dev")
    opened: list[str] = []
    made: list[str] = []
    locks: list[str] = []

    def audit(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], str) and not args[0].startswith(roots):
            opened.append(args[0])
        elif event in ("os.mkdir", "os.makedirs"):
            made.append(str(args[0]))
        elif event.startswith("fcntl."):
            locks.append(event)

    sys.addaudithook(audit)
    out: dict = {"hits": [], "sha256": [], "symbols": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = kernelcache.BundleProgramCache(bundle)
        for item in spec:
            obj, info = compile_item(item, cache)
            out["hits"].append(info.hit)
            out["sha256"].append(hashlib.sha256(bytes(obj.code)).hexdigest())
            out["symbols"].append(sorted((str(k), str(v)) for k, v in (obj.symbol_mapping or {}).items()))
        out["compiles"] = cache.stats().get("compiles", 0)
    out.update(opened=opened, made=made, locks=locks, uid=os.getuid())
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, kernelcache.KernelCacheWarning)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
