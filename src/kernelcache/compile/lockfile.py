"""The kernel lockfile: ``KERNELCACHE_RECORD=path`` appends every compile request to a warm manifest.

Each request a process makes (compile_program, so CuPy too, hit or miss; Triton's look-up
of a compiled kernel) is written once per process as one line, and each line is itself a
complete warm manifest (``{"kernel": [{...}]}``): ``kernelcache warm path --arch ...``
replays the file (cli/warm.py reads it as JSON Lines). The source goes in inline.

One codec, both directions: ``kernel_table`` writes a request as a line, ``request_of``
(what warm and explain call) turns a line back into the CompileRequest, and every line is
checked before it is written to replay to the very key of the request it records. A line
holds what the compile depends on: the options in their own form (a str include_path stays
a str: another form is another key), CuPy's NVRTC command line verbatim (``nvrtc_argv``, its
options come from it), and the working directory (``cwd``), which relative include paths and
quoted includes resolve against: warm compiles each line there.

Many processes may record into one file at once: each line is appended with O_APPEND under
an exclusive ``flock`` of the file, in one write loop, so lines never interleave; a line
torn by a writer that died mid-line is ended before the next one is appended, so it costs
that one line only (the reader skips it, saying so).

Requests that a manifest cannot replay exactly are not recorded (one warning per cause):
``extra_digest`` (warm cannot know what it stands for), bytes source that is not UTF-8,
bytes name expressions, option values that are not JSON (bytes, objects), anything whose
line would replay to another key. A failing file never fails a compile: one warning per
cause, and the compile goes on.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache.compile.metadata import kernel_names
from kernelcache.compile.nvrtc_argv import argv_options, nvrtc_argv
from kernelcache.compile.nvrtc_flags import option_fields
from kernelcache.keys.options import options_fingerprint
from kernelcache.log import WarnOnce
from kernelcache.memo import remember
from kernelcache.regular_file import NotRegularFileError, open_regular

if TYPE_CHECKING:
    from kernelcache.compile.request import CompileRequest

__all__ = ["kernel_table", "options_of", "record", "record_argv", "record_triton", "request_of"]

_LOCK_WAIT_S = 2.0  # a holder appends one line; a stopped one (SIGSTOP) is not waited for longer
_SEEN_LIMIT = 65536
_seen: dict[Any, bool] = {}  # (path, request identity) -> recorded by this process
_warned = WarnOnce()


def record(request: CompileRequest) -> None:
    """Append this compile request to ``KERNELCACHE_RECORD`` (once per process); a no-op when unset."""
    path = config.record_path()
    if path is None:
        return
    fingerprint = options_fingerprint(request.options)
    cwd = _workdir()  # part of the request: the same call made elsewhere may read other headers
    seen_key: Any = None
    if fingerprint is not None and type(request.code) in (str, bytes):
        r = request
        seen_key = (path, cwd, r.code, r.code_type, r.target_type, fingerprint, r.name_expressions, r.extra_digest)
        try:
            if seen_key in _seen:
                return
        except TypeError:  # an unhashable name expression: recorded every time (the reader dedups)
            seen_key = None
    kernel, why_not = kernel_table(request, cwd)
    if kernel is not None:
        why_not = _replays_to_another_key(request, kernel)
        kernel = None if why_not else kernel
    if kernel is None:
        _warn_once(f"skip:{why_not}", f"a request is not recorded in {path}: {why_not}")
    else:
        _append(path, kernel)
    if seen_key is not None:
        remember(_seen, seen_key, True, _SEEN_LIMIT)


def record_triton(triton_key: str, filename: str) -> None:
    """Append Triton's look-up of a compiled kernel (its cache key; Triton compiles it, warm does not)."""
    path = config.record_path()
    if path is None or (path, triton_key, filename) in _seen:
        return
    name = filename[: -len(".json")] if filename.endswith(".json") else filename
    _append(path, {"name": name, "code_type": "triton", "triton_key": triton_key})
    remember(_seen, (path, triton_key, filename), True, _SEEN_LIMIT)


def record_argv(code: str, target_type: str, argv: Sequence[str], name_expressions: Sequence[str]) -> None:
    """Append a CuPy request that hit through its own index (no CompileRequest was made: no
    cuda.core import on that path), as compile_program would have recorded it."""
    path = config.record_path()
    if path is None:
        return
    cwd = _workdir()
    seen_key = (path, cwd, code, target_type, tuple(argv), tuple(name_expressions))
    if seen_key in _seen:
        return
    table = _table(code, "c++", target_type, list(name_expressions), cwd)
    table.update(_argv_fields(argv, option_fields(argv).get("arch")))
    _append(path, table)
    remember(_seen, seen_key, True, _SEEN_LIMIT)


def _workdir() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # deleted: nothing resolves against it
        return None


def kernel_table(request: CompileRequest, cwd: str | None) -> tuple[dict[str, Any] | None, str]:
    """The request as one [[kernel]] table of a warm manifest, or (None, why it cannot be one)."""
    code, options = request.code, request.options
    if request.extra_digest is not None:
        return None, "it has an extra_digest, which a manifest cannot replay"
    if isinstance(code, (bytes, bytearray, memoryview)):
        try:
            code = bytes(code).decode("utf-8")
        except UnicodeDecodeError:
            return None, "its source is bytes that are not UTF-8"
    if not isinstance(code, str):
        return None, f"its source is a {type(code).__name__}"
    if not all(isinstance(name, str) for name in request.name_expressions):
        return None, "a name expression is bytes (a manifest holds str)"
    kernel = _table(code, request.code_type, request.target_type, list(request.name_expressions), cwd)
    argv = nvrtc_argv(options)
    if argv is not None:  # CuPy's command line: its options are what it says
        kernel.update(_argv_fields(argv, getattr(options, "arch", None)))
        return kernel, ""
    table: dict[str, Any] = {}
    for field, value in getattr(options, "__dict__", {}).items():
        if value is None or field.startswith("_"):
            continue
        encoded = _json_value(field, value)
        if encoded is None:
            return None, f"ProgramOptions.{field} is a {type(value).__name__}, which JSON cannot hold"
        table[field] = encoded
    arch = table.pop("arch", None)
    if arch is not None:
        kernel["arch"] = arch
    kernel["options"] = table
    return kernel, ""


def _table(code: str, code_type: str, target_type: str, names: list[str], cwd: str | None) -> dict[str, Any]:
    found = kernel_names(code, None)
    kernel: dict[str, Any] = {
        "name": found[0] if found else (names[0] if names else "kernel"),
        "code": code,
        "code_type": code_type,
        "target": target_type,
    }
    if names:
        kernel["name_expressions"] = names
    kernel["cwd"] = cwd  # None (null): it was deleted; warm compiles the line in an empty directory
    return kernel


def _argv_fields(argv: Sequence[str], arch: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"nvrtc_argv": list(argv)}
    if arch is not None:
        fields["arch"] = arch  # what warm --arch replaces (in the command line itself)
    return fields


def options_of(fields: Mapping[str, Any], arch: str | None, argv: Sequence[str] | None = None) -> Any:
    """The ProgramOptions a kernel table stands for, compiled for ``arch``; TypeError/ValueError
    naming what is wrong. ``argv``: CuPy's command line (its arch flag set to ``arch``)."""
    if argv is not None:
        if fields:
            raise ValueError(f"a kernel with nvrtc_argv takes its options from it, not from options {dict(fields)}")
        return argv_options(_with_arch(argv, arch))
    from cuda.core import ProgramOptions

    options = dict(fields)
    macros = options.get("define_macro")
    if isinstance(macros, list):  # an inner [name, value] is cuda.core's (name, value) pair
        options["define_macro"] = [tuple(m) if isinstance(m, list) else m for m in macros]
    return ProgramOptions(**options) if arch is None else ProgramOptions(arch=arch, **options)


def request_of(kernel: Mapping[str, Any], arch: str | None = None) -> CompileRequest:
    """The request one kernel table (one arch, one target) stands for, for ``arch`` or its own."""
    from kernelcache.compile.request import CompileRequest

    argv = kernel.get("nvrtc_argv")
    options = options_of(kernel.get("options", {}), arch or kernel.get("arch"), argv)
    return CompileRequest.of(
        kernel["code"],
        kernel.get("code_type", "c++"),
        kernel.get("target", "cubin"),
        options,
        tuple(kernel.get("name_expressions", ())),
    )


def _with_arch(argv: Sequence[str], arch: str | None) -> list[str]:
    """``argv`` with the value of its (last) arch flag replaced by ``arch``; appended if it has none."""
    out = list(argv)
    if arch is None or option_fields(out).get("arch") == arch:
        return out
    for i in range(len(out) - 1, -1, -1):
        name, eq, _ = out[i].partition("=")
        if name in ("-arch", "--gpu-architecture"):
            if eq:
                out[i] = f"{name}={arch}"
            else:
                out[i + 1] = arch
            return out
    return [*out, f"-arch={arch}"]


def _replays_to_another_key(request: CompileRequest, kernel: dict[str, Any]) -> str:
    """Why the line would not replay to the request's key ("" when it does): every line is
    read back through JSON and request_of, as warm reads it, before it is written."""
    from kernelcache.keys.derive import key_components

    def components(r: CompileRequest) -> list[tuple[str, bytes]]:
        return key_components(
            code=r.code,
            code_type=r.code_type,
            options=r.options,
            target_type=r.target_type,
            name_expressions=r.name_expressions,
            headers_tracked=r.code_type == "c++",
        )

    try:
        ours = components(request)
    except Exception as exc:  # no key: nothing a cache (or warm) can hold
        return f"no key can be made for it ({type(exc).__name__})"
    try:
        replayed = components(request_of(json.loads(json.dumps(kernel))))
    except Exception as exc:
        return f"its line would not replay ({type(exc).__name__}: {exc})"
    return "" if replayed == ours else "its line would replay to another key"


def _json_value(field: str, value: Any) -> Any:
    """``value`` as JSON that warm turns back into the same option; None when it cannot be.

    define_macro is the one field where a tuple differs from a list to cuda.core: a
    ("NAME", "VALUE") pair is one macro, a list is several. A pair is written as a 2-list
    inside the list of macros (warm reads inner lists as pairs), so a macro's meaning
    survives JSON; a lone pair is written as a list of that one pair (the same macros, so
    the same key: keys.options.macro_flags).
    """
    if isinstance(value, (str, bool, int, float)):
        return value
    if not isinstance(value, (list, tuple)):
        return None
    if field == "define_macro":
        macros = [value] if isinstance(value, tuple) else value
        out = []
        for macro in macros:
            if isinstance(macro, str):
                out.append(macro)
            elif isinstance(macro, tuple) and len(macro) == 2 and all(isinstance(p, str) for p in macro):
                out.append(list(macro))
            else:
                return None
        return out
    items = [_json_value(field, v) for v in value]
    return None if any(v is None for v in items) else items


def _append(path: str, kernel: dict[str, Any]) -> None:
    line = (json.dumps({"kernel": [kernel]}, sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        # A FIFO (or a device) at the path must not block the compile on open or on a write no
        # reader takes; only a regular file is written (a link to one is followed: the user's).
        fd, _ = open_regular(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, follow=True)
    except NotRegularFileError:
        _warn_once("not-a-file", f"cannot record compile requests in {path}: it is not a regular file")
        return
    except OSError as exc:
        _warn_once(f"open:{exc.errno}", f"cannot record compile requests in {path}: {exc.strerror or exc}")
        return
    try:
        _locked(fd)
        # Race: a writer killed mid-line leaves a line without its end. Checked and repaired
        # under the lock, so the next line starts on its own line and only the torn one is lost.
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = b"\n" + line
        view = memoryview(line)
        while view:  # a short write (a signal, a huge source) goes on where it stopped, still locked
            view = view[os.write(fd, view) :]
    except OSError as exc:
        _warn_once(f"write:{exc.errno}", f"cannot record compile requests in {path}: {exc.strerror or exc}")
    finally:
        os.close(fd)  # releases the flock


def _locked(fd: int) -> bool:
    """Take the file's exclusive flock, waiting at most _LOCK_WAIT_S; False: append without it.

    Without the lock a line is still one O_APPEND write, which lands whole and after every
    other write on a local filesystem; the lock adds the tail repair and the short-write loop.
    """
    deadline = time.monotonic() + _LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= deadline:
                return False
        time.sleep(0.001)


def _warn_once(cause: str, message: str) -> None:
    # stacklevel: past this module and compile_program's flow, at the caller's line or near it
    _warned.warn(cause, message, stacklevel=4)
