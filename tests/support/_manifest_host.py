"""One "host" of the header-manifest tests: a long-lived process with its own disk directory
(KERNELCACHE_DIR) and the shared Redis (KERNELCACHE_REDIS_URL), compiling on each line of
stdin and answering one JSON line: was it a hit."""

from __future__ import annotations

import json
import sys
import warnings

from cuda.core import ProgramOptions

from kernelcache import CompileInfo, compile_program


def main() -> None:
    warnings.simplefilter("ignore")
    source, include_dir, arch = sys.argv[1:4]
    for _ in sys.stdin:
        info = CompileInfo()
        compile_program(source, options=ProgramOptions(arch=arch, include_path=[include_dir]), info=info)
        print(json.dumps({"hit": info.hit}), flush=True)


if __name__ == "__main__":
    main()
