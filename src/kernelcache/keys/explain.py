"""A key's components as a person reads them: one rule for "what differs", the key's own.

Every value shown is a function of the bytes the key hashes, and no two different bytes are
shown alike: two requests show no difference exactly when their keys are equal. Options are
shown field by field as the key encodes them (define_macro as the macros NVRTC receives, a
PTX key's fields through the linker's gates), read back from options.encode()'s tagged form;
the source and other opaque inputs as a short digest; types and toolchain identities as text.
``explain_program_cache_key``, ``kernelcache explain`` and a miss's reason all use it.
"""

from __future__ import annotations

import hashlib

__all__ = ["explain_components", "shown"]

# Components whose bytes are text a person reads as it is.
_TEXT = frozenset({"schema", "code_type", "target_type", "environment"})


def explain_components(components: list[tuple[str, bytes]]) -> dict[str, str]:
    """``{name: readable value}`` for a key's components (``options`` split into ``options.<field>``)."""
    out: dict[str, str] = {}
    for name, value in components:
        if name in _TEXT or name.startswith("toolchain."):
            out[name] = value.decode("utf-8", "backslashreplace")
        elif name == "options":
            out.update((f"options.{field}", text) for field, text in split_options(value))
        elif name == "name_expressions":
            out[name] = shown(value)
        else:  # the source, extra_digest, header digests: a digest of the bytes
            out[name] = hashlib.sha256(value).hexdigest()[:16]
    return out


def split_options(blob: bytes) -> list[tuple[str, str]]:
    """The ``options`` component as (field, readable value) pairs, in the key's order.

    The component is a run of ``<len>:<field>`` tags, each followed by one encoded value
    (options.option_components); both are self-delimiting, so the split is unique.
    """
    pairs, pos = [], 0
    while pos < len(blob):
        colon = blob.index(b":", pos)
        size = int(blob[pos:colon])
        field = blob[colon + 1 : colon + 1 + size].decode("utf-8", "surrogatepass")
        text, pos = _read(blob, colon + 1 + size)
        pairs.append((field, text))
    return pairs


def shown(encoded: bytes) -> str:
    """One value encoded by options.encode(), as Python-like text (lists for list and tuple, as
    the encoding makes them one)."""
    text, end = _read(encoded, 0)
    if end != len(encoded):
        raise ValueError("not one encoded value")
    return text


def _read(blob: bytes, pos: int) -> tuple[str, int]:
    """The value encoded at ``pos``, as text, and where it ends."""
    tag = blob[pos : pos + 1]
    if tag in _WORDS:
        return _WORDS[tag], pos + 1
    if tag == b"i":
        end = blob.index(b";", pos)
        return blob[pos + 1 : end].decode(), end + 1
    if tag == b"s":
        text, end = _text(blob, pos)
        return repr(text), end
    if tag == b"b":
        raw, end = _sized(blob, pos)
        return repr(raw), end
    if tag == b"l":
        colon = blob.index(b":", pos)
        count, items, pos = int(blob[pos + 1 : colon]), [], colon + 1
        for _ in range(count):
            text, pos = _read(blob, pos)
            items.append(text)
        return "[" + ", ".join(items) + "]", pos
    if tag == b"f":  # the float's exact hex, as a str
        text, end = _text(blob, pos + 1)
        return repr(float.fromhex(text)), end
    if tag == b"o":  # another object: its type and repr, as a str
        text, end = _text(blob, pos + 1)
        return f"object({text!r})", end
    raise ValueError(f"not an encoded value at byte {pos}")


_WORDS = {b"N": "None", b"T": "True", b"F": "False"}


def _sized(blob: bytes, pos: int) -> tuple[bytes, int]:
    """The raw bytes of a ``<tag><len>:<bytes>`` value at ``pos``, and where it ends."""
    colon = blob.index(b":", pos)
    end = colon + 1 + int(blob[pos + 1 : colon])
    return blob[colon + 1 : end], end


def _text(blob: bytes, pos: int) -> tuple[str, int]:
    raw, end = _sized(blob, pos)
    return raw.decode("utf-8", "surrogatepass"), end
