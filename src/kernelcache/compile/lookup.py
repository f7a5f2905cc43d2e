"""One call's look-up: its key material computed once (memoised per call arguments), then
the record found under the entry key, or, for a C++ source that may read headers, under the
full key of the header variant that matches the files on disk now (headers.manifests)."""

from __future__ import annotations

from typing import Any

from kernelcache.compile.metadata import read_artifact
from kernelcache.compile.request import CompileRequest
from kernelcache.headers import scan as includes
from kernelcache.keys import basedir, workdir
from kernelcache.keys.derive import digest_components, key_components
from kernelcache.keys.options import options_fingerprint
from kernelcache.keys.toolchain import toolchain_for
from kernelcache.memo import remember
from kernelcache.stores.base import Meta, ProgramCacheResource

# What find() returns: (key, record or None, header variant or None).
Found = tuple[bytes, tuple[bytes, Meta] | None, dict[str, Any] | None]

# request fields -> (base components, manifest key, entry key, whether to trace headers)
_base_memo: dict[Any, tuple[list[tuple[str, bytes]], bytes, bytes, bool]] = {}


class Lookup:
    """One call's key material, computed once: base components, manifest key, toolchain."""

    def __init__(self, cache: ProgramCacheResource, request: CompileRequest) -> None:
        self.cache = cache
        self.request = request
        code_type = request.code_type
        self.toolchain = toolchain_for(code_type) if code_type in ("c++", "ptx", "nvvm") else None
        # Header tracking for every C++ compile, extra_digest or not (it adds to the key,
        # it does not replace tracking): even with no include_path, NVRTC reads quoted
        # includes from the current directory. A source that cannot name a file (no
        # include, no pre_include: see headers.scan.may_read_files) needs no trace and no
        # manifest; its key is complete without headers.
        self.headers_tracked = code_type == "c++"
        # The key material of a repeated call is memoised by the request's fields (the
        # options by their values: a mutated ProgramOptions is a new memo key), and so is
        # ``track``, which depends on nothing else (the text and the options).
        fingerprint = options_fingerprint(request.options)
        base_dir = basedir.current()  # paths under it enter the key relative to it
        cwd = workdir.key_component(request.options, code_type, fingerprint)  # [] unless the output names it
        memo_key: Any = None
        if fingerprint is not None and type(request.code) in (str, bytes):
            memo_key = (
                request.code,
                code_type,
                request.target_type,
                fingerprint,
                request.name_expressions,
                request.extra_digest,
                base_dir,
                tuple(cwd),
            )
            try:
                found = _base_memo.get(memo_key)
            except TypeError:  # an unhashable name expression: no memo
                memo_key, found = None, None
            if found is not None:
                self.base, self.manifest_key, self.entry_key, self.track = found
                return
        named = request.name_expressions
        self.track = self.headers_tracked and includes.may_read_files(request.code, request.options, named)
        self.base = key_components(
            code=request.code,
            code_type=code_type,
            options=basedir.key_options(request.options, code_type, request.target_type, base_dir),
            target_type=request.target_type,
            name_expressions=request.name_expressions,
            extra_digest=request.extra_digest,
            headers_tracked=self.headers_tracked,
            toolchain=self.toolchain,
        ) + cwd
        # Tracked: the entry key depends on the headers, found through the manifest.
        # Untracked: no manifest; the entry key is known now.
        if self.track:  # header manifests: imported by the calls whose source may read headers
            from kernelcache.headers import manifests

            self.manifest_key = manifests.manifest_key(self.base)
        else:
            self.manifest_key = b""
        self.entry_key = b"" if self.track else digest_components(self.base)
        if memo_key is not None:
            remember(_base_memo, memo_key, (self.base, self.manifest_key, self.entry_key, self.track), 4096)

    @property
    def flight_key(self) -> bytes:
        """The key single flight is per: the source+options (manifest key) when headers are
        tracked, since the header-complete key is only known after the compile; else the key."""
        return self.manifest_key or self.entry_key

    def find(self) -> Found:
        """(key, record or None, header variant or None); key is b"" when no variant matches."""
        if not self.track:
            return self.entry_key, read_artifact(self.cache, self.entry_key), None
        from kernelcache.headers import digests as hdr
        from kernelcache.headers import manifests

        cwd = hdr.workdir()
        if cwd is None:  # deleted: no variant can be vouched for (compile.tracing: compiled untracked)
            return b"", None, None
        variant = manifests.matching_variant(self.cache, self.manifest_key, hdr.search_dirs(self.request.options, cwd))
        if variant is None:
            return b"", None, None
        key = manifests.full_key(self.base, variant, self.manifest_key)
        return key, read_artifact(self.cache, key), variant
