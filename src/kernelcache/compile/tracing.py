"""The header tracking of one C++ miss: where the header pass writes its trace (compilers.
header_pass: NVRTC's front end alone, after the plain compile), the headers' digests before
the compile, and the header variant built from what the compile read.

A miss whose preprocessing this process has traced before (the same source, program name,
flags and working directory: name expressions differ, which the pass never sees) needs no
pass where the headers are still as they were then: the variant built now from the headers
that pass listed is the one it built (same headers, same contents, every probe resolving where
it did), and NVRTC's preprocessing, a function of exactly those, read those same headers. So
the variant is built from that list beside the compile, and a pass runs only where the build
differs (a header edited, a new one shadowing). On the corpus's CuPy kernels, 80 compiles are
7 distinct preprocessings (templates instantiated one name expression at a time), and the pass
costs about what the compile does on the H200 host (NVRTC's front end is most of the compile).
Across processes, the store holds the digest of the last variant each preprocessing gave
(headers.manifests.preprocessing_hint): the variant's own record names its headers.

Any step that cannot vouch for the headers (no room for the trace, a trace NVRTC did not
write or wrote incomplete, a header that changed while NVRTC read it, a working directory
that was deleted) sets ``not_stored``: the compile's result is returned to the caller and
never stored under a key that would claim it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from kernelcache.compile.request import CompileRequest
from kernelcache.headers import digests as hdr
from kernelcache.headers import index as header_index
from kernelcache.headers import manifests, variants
from kernelcache.headers import scan as includes
from kernelcache.keys.derive import digest_components
from kernelcache.memo import remember
from kernelcache.runners.compilers import header_pass_args, new_trace_path, plan_compile, remove_trace
from kernelcache.stores.base import ProgramCacheResource

if TYPE_CHECKING:
    from kernelcache.runners.beside import Job

# preprocessing key -> the digest of the variant its last pass in this process gave (the store's
# hint, headers.manifests, for the others). Only ever a hint: see build_known.
_traced: dict[bytes, str] = {}


def install_bundled_headers(options: Any) -> None:
    """Install NVRTC's bundled headers into each root the options name, as the compile would.

    NVRTC installs them during a compile that finds the root without an up-to-date copy (a new
    home directory, a new NVRTC), and the headers it then reads are stamped after the compile's
    start, so that compile could not be stored. Installing first (the same call NVRTC makes,
    skipping an up-to-date copy: about 15 us) stores it; after an install, this waits until the
    filesystem's clock has moved past the marker NVRTC writes last (one tick, 1-10 ms), so the
    copy is older than the compile's start. Any failure leaves it to the compile."""
    roots = hdr.bundled_roots(options)
    if not roots:
        return
    try:
        from cuda.bindings import nvrtc

        for _, root in roots:
            marker = os.path.join(root, _MARKER)
            before = _stamp(marker)
            nvrtc.nvrtcInstallBundledHeaders(root.encode(), 0)  # 0: skip an up-to-date copy
            after = _stamp(marker)
            deadline = time.monotonic() + 0.1
            while after is not None and after != before and hdr.now_ns() <= after and time.monotonic() < deadline:
                time.sleep(0.001)
    except Exception:  # noqa: BLE001 - an older NVRTC, a read-only home: the compile installs (or fails) as before
        return


_MARKER = ".nvrtc_headers_version"  # nvrtcInstallBundledHeaders' version marker


def _stamp(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return max(st.st_mtime_ns, st.st_ctime_ns)


class HeaderTrace:
    """Started right before the compile (the digests and the clock the variant is judged by)."""

    def __init__(
        self, request: CompileRequest, manifest_key: bytes, store: ProgramCacheResource, compiler: str = ""
    ) -> None:
        self.request, self.store, self.compiler = request, store, compiler  # compiler: the key's NVRTC identity
        self.tmp_dir = tmp_dir = store.tmp_dir
        self.index = header_index.for_store(store)  # the digests read after the compile are kept there
        self.not_stored = ""  # why this compile's result cannot be stored, when it cannot
        cwd = hdr.workdir()
        self.path = None if cwd is None else new_trace_path(tmp_dir)  # where NVRTC writes what it read
        if cwd is None:
            # NVRTC compiles in a deleted directory (a batch job's, say) as anywhere else, but
            # its quoted includes may resolve against a path no look-up can name: the compile
            # runs untraced and its result is the caller's alone.
            self.not_stored = "the working directory was deleted (headers read from it cannot be tracked)"
        elif self.path is None:
            self.not_stored = "there is no room for NVRTC's header trace (a full disk would abort NVRTC)"
        self.cwd = cwd or "/"
        self.dirs = [] if cwd is None else hdr.search_dirs(request.options, cwd)
        install_bundled_headers(request.options)
        self.before = manifests.digests_before(manifest_key, self.dirs)
        self.started_ns = hdr.now_ns()  # the clock files are stamped with
        self._built: tuple[dict[str, Any] | None, list[str], Any] | None = None  # by prepare
        self._stored_hint: str | None = None  # the store's preprocessing hint, where build_known read it
        self._preprocessing = b""  # preprocessing_key's, once asked
        self._known_digest: str | None = None  # the variant an earlier pass gave, where build_known found one
        self._known: Job | None = None  # start_known's job

    def preprocessing_key(self) -> bytes:
        """What NVRTC's preprocessing of this compile is a function of, besides the files: the
        header pass's own inputs (text, program name, flags), the working directory and the
        NVRTC build (its builtin headers include others)."""
        if not self._preprocessing:
            request = self.request
            source, options, _ = plan_compile(request, None)
            text, name, flags, _ = header_pass_args(source, options, request.target_type, "")
            self._preprocessing = digest_components(
                [
                    ("text", text.encode("utf-8", "surrogateescape")),
                    ("program_name", name),
                    ("flags", b"\0".join(flags)),  # NVRTC's flags are C strings: none holds a NUL
                    ("cwd", self.cwd.encode("utf-8", "surrogateescape")),
                    ("compiler", self.compiler.encode()),
                ]
            )
        return self._preprocessing

    def build_known(self) -> bool:
        """Whether an earlier pass of this preprocessing listed its headers (this process's, else
        the store's hint): then ``start_known`` builds the variant from that list beside the
        compile; False where none is known."""
        if self.not_stored:
            return False
        key = self.preprocessing_key()
        # The store's hint is read even where this process knows one: a store that lacks it (or
        # holds another) is given this compile's (variant()), so every store that took a traced
        # compile can spare its other readers the pass.
        self._stored_hint = manifests.preprocessing_hint(self.store, key)
        self._known_digest = _traced.get(key) or self._stored_hint
        return self._known_digest is not None

    def start_known(self) -> None:
        """Start build_known's build on a kept thread: called when the compiler takes over (it
        releases the GIL), so that the build's Python never holds up this thread's way to it.
        Where no thread can start (the interpreter is shutting down), the pass runs instead."""
        from kernelcache.runners.beside import on_a_thread

        if self._known_digest is None or self._known is not None:
            return
        try:
            self._known = on_a_thread(self._build_known, self._known_digest)
        except RuntimeError:
            return

    def _build_known(self, digest: str) -> None:
        # Race: a header edited before the compile started is read by this build too (it runs
        # after started_ns): the digest then differs and the pass runs. One edited after the
        # start is stamped after it, and a file that appeared, after this build resolved the
        # probes, at a place an #include searches first is there after the compile: the check
        # again in variant() refuses to store either (digests.changed_during, untraced).
        try:
            earlier = manifests.stored_variant(self.store, digest)
            found = variants.tracked_paths(earlier, self.dirs) if earlier is not None else None
            built = self._build(found) if found is not None else None
        except Exception:  # noqa: BLE001 - the pass runs instead
            return
        if built is None or built[0] is None or built[0]["digest"] != digest:
            return
        if any(not isinstance(entry[0], str) for entry in built[0]["headers"]):
            # A header reached by a computed include or #include_next: no probe says where NVRTC
            # looked before it, so nothing after the compile could see a file created there
            # meanwhile (digests.changed_during, untraced). The pass runs.
            return
        self._built = built

    def known_holds(self) -> bool:
        """After build_known: whether the earlier pass's headers still hold (the variant is then
        built); False: this compile needs its own header pass."""
        if self._known is None:
            return False  # never started: the compile did not start, or no thread could
        self._known.result()  # _build_known raises nothing
        self._known = None
        return self._built is not None

    def prepare(self) -> None:
        """Build the variant from the trace now, on the header pass's thread while the compile
        may still run (runners.beside); ``variant`` then checks again only what may have
        changed since. Any failure here leaves the whole build to ``variant``."""
        try:
            self._built = self._build()
        except Exception:  # noqa: BLE001 - built again, on the caller's thread, where it raises
            self._built = None

    def variant(self) -> dict[str, Any] | None:
        """The header variant this compile read; None (and ``not_stored`` set) when unknown."""
        if self.not_stored:
            return None
        assert self.path is not None
        if hdr.workdir() != self.cwd:
            # Race: another thread changed directory between the compile and the header pass
            # (or during either): the two may have resolved quoted includes in different places.
            self.not_stored = "the working directory changed during the compile"
            return None
        built, self._built = self._built, None
        variant, changed, again = built if built is not None else self._build()
        if built is not None and variant is not None:
            # Race: built while the compile ran; a header it read may have changed after, before
            # NVRTC read it. Such a header is stamped after the start: checked again, now.
            changed = sorted({*changed, *again()})
        if variant is None:
            self.not_stored = changed[0]
            return None
        self.index.save()
        if changed:
            self.not_stored = hdr.why_not_stored(changed)
            return None
        key, digest = self.preprocessing_key(), variant["digest"]
        if _traced.get(key) != digest:
            remember(_traced, key, digest, 1024)
        if self._stored_hint != digest:
            # Race: two threads or processes tracing the same preprocessing both write; either
            # digest is a true hint (each is checked where it is used).
            manifests.store_preprocessing_hint(self.store, key, digest)
        return variant

    def _build(self, found: list[str] | None = None) -> tuple[dict[str, Any] | None, list[str], Any]:
        """(variant, changed paths, the check again) from ``found`` (default: the trace's
        headers); (None, [why], None) when the trace is not usable."""
        assert self.path is not None
        known = found is not None  # from an earlier pass (build_known): no trace of this compile
        if found is None:
            found, why = hdr.headers_from_trace(self.path, self.cwd)
            if found is None:
                return None, [why], None
        options = self.request.options
        return variants.build_variant(
            found,
            self.dirs,
            hdr.first_include(options),
            includes.main_text(self.request.code, self.request.name_expressions),
            includes.pre_includes(options),
            self.started_ns,
            self.before,
            includes.option_macros(options),
            self.index,
            untraced=known,
        )

    def remove(self) -> None:
        if self.path is not None:
            remove_trace(self.path)
            self.path = None
