"""A header variant's record: its canonical bytes (what its digest is of and what the store
holds under headers.manifests.variant_key), and the variant read back from them.

A record is ``[headers, probes, first_include]`` or ``[headers, probes, first_include, cwd]`` as
compact JSON (ASCII: json.dumps escapes every other character). headers.variants says what each
part means.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def variant_bytes(variant: dict[str, Any]) -> bytes:
    """A variant's canonical bytes (headers, probes, search layout, the bound cwd): what its
    record holds (headers.manifests) and what its digest is of."""
    parts = [variant.get("headers", []), probes_of(variant), variant.get("first_include")]
    if "cwd" in variant:
        parts.append(variant["cwd"])
    return json.dumps(parts, separators=(",", ":")).encode()


def variant_digest(variant: dict[str, Any]) -> str:
    """The key component for a variant, hex: the SHA-256 of its canonical bytes."""
    return hashlib.sha256(variant_bytes(variant)).hexdigest()


def is_record_of(raw: bytes, digest: str) -> bool:
    """Whether ``raw`` are the canonical bytes of the variant ``digest`` (variant_digest's rule):
    the one check by which a stored record is taken for that variant."""
    return hashlib.sha256(raw).hexdigest() == digest


_DECODER = json.JSONDecoder()


def variant_from_bytes(raw: bytes, digest: str) -> dict[str, Any] | None:
    """The variant whose canonical bytes ``raw`` are, if their SHA-256 is ``digest``: a record
    is never trusted for what it claims to be (the digest decides which entry a hit reads).

    Its probes are parsed only when a look-up needs them (probes_of): a hit whose proof holds
    (headers.index) never does, and they are most of a deep variant's bytes (6,500 probes, 300 KB
    of a CUB kernel's 376 KB). So the headers are read from the front and the small fields from
    the back; the slice between is the probes' text."""
    if not is_record_of(raw, digest):
        return None
    try:
        text = raw.decode("ascii")  # canonical bytes are json.dumps' (ASCII: every other char escaped)
        if not text.startswith("[["):
            return None
        headers, after = _DECODER.raw_decode(text, 1)
        tail = _tail(text)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(headers, list) or tail is None:
        return None
    probes_end, first_include, cwd = tail
    if text[after : after + 2] != ",[" or text[probes_end - 1] != "]" or probes_end <= after + 2:
        return None
    variant: dict[str, Any] = {"headers": headers, "first_include": first_include}
    if cwd is not None:
        variant["cwd"] = cwd
    variant["digest"] = digest
    variant["probes_text"] = text[after + 1 : probes_end]
    return variant


def _tail(text: str) -> tuple[int, Any, str | None] | None:
    """(where the probes' text ends, first_include, the bound cwd or None) of a variant's
    canonical text ``[headers,probes,first_include]`` or ``[...,first_include,"cwd"]``, read
    from its end: the cwd is a JSON string (its closing quote ends the text; its opening one is
    the last quote not escaped by an odd run of backslashes), first_include a number."""
    if not text.endswith("]"):
        return None
    end = len(text) - 1
    cwd = None
    if text.endswith('"]'):
        at = end - 1
        while True:
            at = text.rfind('"', 0, at)
            if at < 0:
                return None
            run = at
            while text[run - 1] == "\\":
                run -= 1
            if (at - run) % 2 == 0:
                break
        found = json.loads(text[at:end])
        if not isinstance(found, str) or text[at - 1] != ",":
            return None
        cwd, end = found, at - 1
    comma = text.rfind(",", 0, end)
    if comma < 0:
        return None
    return comma, json.loads(text[comma + 1 : end]), cwd


def probes_of(variant: dict[str, Any]) -> list[Any]:
    """The variant's probes (parsed from its record's text on first use; ValueError when that
    text is not a list: such a variant matches nothing)."""
    probes = variant.get("probes")
    if probes is None:
        text = variant.get("probes_text")
        if text is None:
            return []
        probes = json.loads(text)
        if not isinstance(probes, list):
            raise ValueError("a variant's probes are not a list")
        variant["probes"] = probes  # parsed twice at most, by two threads at once: the same list
    return probes  # type: ignore[no-any-return]
