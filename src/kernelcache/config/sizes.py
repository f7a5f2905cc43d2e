"""Sizes as people write them ('2GB', '512MiB') and read them ('12.0 kB'), and a value shown in an error."""

from __future__ import annotations

import re

# Larger than any disk; beyond it a "size" is a typo (and int(float(...)) would overflow).
_MAX_SANE_SIZE = 2**63 - 1
_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "K": 10**3,
    "KB": 10**3,
    "KIB": 2**10,
    "M": 10**6,
    "MB": 10**6,
    "MIB": 2**20,
    "G": 10**9,
    "GB": 10**9,
    "GIB": 2**30,
    "T": 10**12,
    "TB": 10**12,
    "TIB": 2**40,
}


def shown(raw: str) -> str:
    """A value as an error message quotes it: repr, cut at 60 characters."""
    return repr(raw) if len(raw) <= 60 else repr(raw[:57]) + "..."



def parse_size(text: str) -> int:
    """'2GB' -> 2000000000, '512MiB' -> 536870912; ValueError naming the accepted forms."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _SIZE_UNITS:
        raise ValueError(f"bad size {shown(text)}: use a number with an optional unit, e.g. 500MB, 2GB, 1.5GiB")
    from decimal import Decimal, InvalidOperation  # exact, and only where a size is written out

    try:
        value = int(Decimal(m.group(1)) * _SIZE_UNITS[unit])
    except (InvalidOperation, OverflowError):  # pragma: no cover - the regex admits plain decimals only
        value = _MAX_SANE_SIZE + 1
    if value > _MAX_SANE_SIZE:
        raise ValueError(f"bad size {shown(text)}: larger than any disk (at most 9.2 EB)")
    return value


def format_size(nbytes: int | None) -> str:
    """Bytes for people: '12.0 kB', '10.0 GB'; None is 'no cap'."""
    if nbytes is None:
        return "no cap"
    if nbytes < 1000:
        return f"{nbytes} B"
    value = float(nbytes)
    units = ("kB", "MB", "GB", "TB", "PB", "EB")
    i = 0
    while True:
        value /= 1000
        if value < 1000 or i == len(units) - 1:
            return f"{value:.1f} {units[i]}"
        i += 1
