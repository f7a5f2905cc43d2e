"""One call's look-up: its key material computed once (memoised per call arguments), then
the record found under the entry key, or, for a C++ source that may read headers, under the
full key of the header variant that matches the files on disk now (manifests.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernelcache.compile.metadata import read_artifact
from kernelcache.headers import digests as hdr
from kernelcache.headers import manifests
from kernelcache.headers import scan as includes
from kernelcache.keys.derive import digest_components, key_components
from kernelcache.keys.options import options_fingerprint
from kernelcache.keys.toolchain import toolchain_for
from kernelcache.memo import remember
from kernelcache.stores.base import Meta, ProgramCacheResource

# call arguments -> (base components, manifest key, entry key, whether to trace headers)
_base_memo: dict[Any, tuple[list[tuple[str, bytes]], bytes, bytes, bool]] = {}


class Lookup:
    """One call's key material, computed once: base components, manifest key, toolchain."""

    def __init__(
        self,
        cache: ProgramCacheResource,
        code: str | bytes,
        code_type: str,
        target_type: str,
        options: Any,
        name_expressions: Sequence[str | bytes],
        extra_digest: bytes | None,
    ) -> None:
        self.cache = cache
        self.options = options
        self.code_type = code_type.lower() if isinstance(code_type, str) else code_type
        self.target_type = target_type.lower() if isinstance(target_type, str) else target_type
        self.toolchain = toolchain_for(self.code_type) if self.code_type in ("c++", "ptx", "nvvm") else None
        # Header tracking for every C++ compile, extra_digest or not (it adds to the key,
        # it does not replace tracking): even with no include_path, NVRTC reads quoted
        # includes from the current directory. A source that cannot name a file (no
        # include, no pre_include: see includes.may_read_files) needs no trace and no
        # manifest; its key is complete without headers.
        self.headers_tracked = self.code_type == "c++"
        # The key material of a repeated call is memoised by the call's own arguments (the
        # options by their values: a mutated ProgramOptions is a new memo key), and so is
        # ``track``, which depends on nothing else (the text and the options).
        fingerprint = options_fingerprint(options)
        memo_key: Any = None
        if fingerprint is not None and type(code) in (str, bytes):
            names = tuple(name_expressions)
            memo_key = (code, code_type, target_type, fingerprint, names, extra_digest)
            try:
                found = _base_memo.get(memo_key)
            except TypeError:  # an unhashable name expression: no memo
                memo_key, found = None, None
            if found is not None:
                self.base, self.manifest_key, self.entry_key, self.track = found
                return
        self.track = self.headers_tracked and includes.may_read_files(code, options)
        self.base = key_components(
            code=code,
            code_type=code_type,
            options=options,
            target_type=target_type,
            name_expressions=name_expressions,
            extra_digest=extra_digest,
            headers_tracked=self.headers_tracked,
            toolchain=self.toolchain,
        )
        # Tracked: the entry key depends on the headers, found through the manifest.
        # Untracked: no manifest; the entry key is known now.
        self.manifest_key = manifests.manifest_key(self.base) if self.track else b""
        self.entry_key = b"" if self.track else digest_components(self.base)
        if memo_key is not None:
            remember(_base_memo, memo_key, (self.base, self.manifest_key, self.entry_key, self.track), 4096)

    def find(self) -> tuple[bytes, tuple[bytes, Meta] | None, dict[str, Any] | None]:
        """(key, record or None, header variant or None); key is b"" when no variant matches."""
        if not self.track:
            return self.entry_key, read_artifact(self.cache, self.entry_key), None
        variant = manifests.matching_variant(self.cache, self.manifest_key, hdr.search_dirs(self.options))
        if variant is None:
            return b"", None, None
        key = manifests.full_key(self.base, variant, self.manifest_key)
        return key, read_artifact(self.cache, key), variant
