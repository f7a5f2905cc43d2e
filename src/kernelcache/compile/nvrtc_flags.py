"""NVRTC command-line options (as CuPy takes them) -> cuda.core ProgramOptions.

cuda.core builds NVRTC's command line from ProgramOptions fields and takes no raw flags,
so a tool that speaks flags (CuPy's ``options=(...)``) is translated here, flag by flag.
An option this table does not know raises ValueError: dropping it silently would compile
something else than asked (and cache it under a key that does not say so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def _bool(value: str) -> bool:
    # NVRTC takes exactly "true" or "false" (-ftz=yes, -ftz=1, -fmad=on, -ftz=True are its
    # INVALID_OPTION): anything else would be a compile NVRTC refuses.
    if value == "true":
        return True
    if value == "false":
        return False
    raise ValueError(f"expected true or false (as NVRTC), got {value!r}")


def _on(value: str) -> bool:
    # NVRTC's -dopt takes "on" only (-dopt=off is its INVALID_OPTION, even with -G): any
    # other word must be refused, not read as "off", which would compile something else.
    if value.strip().lower() == "on":
        return True
    raise ValueError(f"NVRTC's -dopt takes only 'on', got {value!r}")


def _numbers(value: str) -> list[int]:
    # -diag-suppress=177,550: NVRTC takes a comma-separated list of diagnostic numbers.
    return [int(v) for v in value.split(",")]


def _macro(value: str) -> str | tuple[str, str]:
    name, eq, body = value.partition("=")
    return (name, body) if eq else name


# flag spellings -> (ProgramOptions field, value parser, repeatable: collected into a list)
_VALUED: dict[str, tuple[str, Callable[[str], Any], bool]] = {}
for _names, _field, _parse, _many in (
    (("-arch", "--gpu-architecture"), "arch", str, False),
    (("-std", "--std"), "std", str, False),
    (("-I", "--include-path"), "include_path", str, True),
    (("-D", "--define-macro"), "define_macro", _macro, True),
    (("-U", "--undefine-macro"), "undefine_macro", str, True),
    (("-include", "--pre-include"), "pre_include", str, True),
    (("-ftz", "--ftz"), "ftz", _bool, False),
    (("-prec-sqrt", "--prec-sqrt"), "prec_sqrt", _bool, False),
    (("-prec-div", "--prec-div"), "prec_div", _bool, False),
    (("-fmad", "--fmad"), "fma", _bool, False),
    (("-maxrregcount", "--maxrregcount"), "max_register_count", int, False),
    (("-dopt", "--dopt"), "device_code_optimize", _on, False),
    (("-Xptxas", "--ptxas-options"), "ptxas_options", str, True),
    (("-diag-suppress", "--diag-suppress"), "diag_suppress", _numbers, True),
    (("-diag-error", "--diag-error"), "diag_error", _numbers, True),
    (("-diag-warn", "--diag-warn"), "diag_warn", _numbers, True),
    (("-builtin-move-forward", "--builtin-move-forward"), "builtin_move_forward", _bool, False),
    (("-builtin-initializer-list", "--builtin-initializer-list"), "builtin_initializer_list", _bool, False),
    (("-split-compile", "--split-compile"), "split_compile", int, False),
    (("-rdc", "--relocatable-device-code"), "relocatable_device_code", _bool, False),
):
    for _n in _names:
        _VALUED[_n] = (_field, _parse, _many)

_SWITCHES: dict[str, str] = {}
for _names, _field in (
    (("-use_fast_math", "--use_fast_math"), "use_fast_math"),
    (("-G", "--device-debug"), "debug"),
    (("-lineinfo", "--generate-line-info"), "lineinfo"),
    (("-dlto", "--dlink-time-opt"), "link_time_optimization"),
    (("-ewp", "--extensible-whole-program"), "extensible_whole_program"),
    (("-extra-device-vectorization", "--extra-device-vectorization"), "extra_device_vectorization"),
    (("-default-device", "--device-as-default-execution-space"), "device_as_default_execution_space"),
    (("-w", "--disable-warnings"), "disable_warnings"),
    (("-restrict", "--restrict"), "restrict"),
    (("-no-source-include", "--no-source-include"), "no_source_include"),
    (("-device-int128", "--device-int128"), "device_int128"),
):
    for _n in _names:
        _SWITCHES[_n] = _field

# Relocatable code needs linking with the device runtime after the compile: kernelcache.cupy
# does that link (as CuPy does), a plain translation does not, so program_options refuses
# these rather than hand back an unlinkable image.
RELOCATABLE = frozenset({"-rdc", "--relocatable-device-code", "-dc", "--device-c"})


def program_options(flags: Sequence[str]) -> Any:
    """ProgramOptions equivalent to NVRTC ``flags``; ValueError naming any flag it cannot map.

    Accepts ``-X=v``, ``-X v`` (two items) and, for ``-I``/``-D``/``-U``, ``-Xv``.
    Repeated single-valued flags: the last one wins, as on NVRTC's command line.
    Relocatable device code (``-dc``, ``-rdc=true``) is refused: it needs a link.
    """
    from cuda.core import ProgramOptions

    for flag in flags if not isinstance(flags, (str, bytes)) else ():
        if isinstance(flag, str) and flag.partition("=")[0] in RELOCATABLE:
            raise ValueError(f"compiler option {flag!r} (relocatable device code) is not supported by kernelcache")
    return ProgramOptions(**option_fields(flags))


def option_fields(flags: Sequence[str]) -> dict[str, Any]:
    """The ProgramOptions fields for ``flags`` (checks them without building ProgramOptions,
    which asks the driver for a default arch when none is given)."""
    if isinstance(flags, (str, bytes)):  # options="-std=c++17" would be read letter by letter
        raise TypeError(f"compiler options must be a sequence of str, not one {type(flags).__name__}: use ({flags!r},)")
    fields: dict[str, Any] = {}
    items = list(flags)
    i = 0
    while i < len(items):
        flag = items[i]
        if not isinstance(flag, str):
            raise TypeError(f"compiler options must be str, not {type(flag).__name__}: {flag!r}")
        i += 1
        name, eq, value = flag.partition("=")
        if name in ("-dc", "--device-c") and not eq:
            fields["relocatable_device_code"] = True
            continue
        if name in _SWITCHES and not eq:
            fields[_SWITCHES[name]] = True
            continue
        if name not in _VALUED and flag[:2] in ("-I", "-D", "-U") and len(flag) > 2:
            name, value, eq = flag[:2], flag[2:], "="
        if name not in _VALUED:
            raise ValueError(
                f"compiler option {flag!r} is not one kernelcache can pass to NVRTC through cuda.core; "
                "remove it, or compile with the tool's own compiler"
            )
        if not eq:
            if i >= len(items):
                raise ValueError(f"compiler option {flag!r} needs a value")
            value, i = items[i], i + 1
        field, parse, many = _VALUED[name]
        try:
            parsed = parse(value)
        except ValueError as exc:
            raise ValueError(f"bad value in compiler option {flag!r}: {exc}") from exc
        if many:
            fields.setdefault(field, []).extend(parsed if isinstance(parsed, list) else [parsed])
        else:
            fields[field] = parsed
    return fields
