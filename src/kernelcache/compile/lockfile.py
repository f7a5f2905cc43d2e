"""The kernel lockfile: ``KERNELCACHE_RECORD=path`` appends every compile request to a warm manifest.

Each request a process makes (compile_program, so CuPy too, hit or miss; Triton's look-up
of a compiled kernel) is written once per process as one line, and each line is itself a
complete warm manifest (``{"kernel": [{...}]}``): ``kernelcache warm path --arch ...``
replays the file (cli/warm.py reads it as JSON Lines). The source goes in inline, so the
file alone rebuilds every kernel on a machine without the program or a GPU.

Many processes may record into one file at once: each line is appended with O_APPEND under
an exclusive ``flock`` of the file, in one write loop, so lines never interleave; a line
torn by a writer that died mid-write is ended before the next one is appended, so it costs
that one line only (the reader skips it, saying so).

Requests that a manifest cannot replay exactly are not recorded (one warning per cause):
``extra_digest`` (warm cannot know what it stands for), bytes source that is not UTF-8,
option values that are not JSON (bytes, objects). A failing file never fails a compile:
one warning per cause, and the compile goes on.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from typing import TYPE_CHECKING, Any

from kernelcache import config
from kernelcache.compile.metadata import kernel_names
from kernelcache.keys.options import options_fingerprint
from kernelcache.log import WarnOnce
from kernelcache.memo import remember
from kernelcache.regular_file import NotRegularFileError, open_regular

if TYPE_CHECKING:
    from kernelcache.compile.request import CompileRequest

__all__ = ["record", "record_triton"]

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
    seen_key: Any = None
    if fingerprint is not None and type(request.code) in (str, bytes):
        r = request
        seen_key = (path, r.code, r.code_type, r.target_type, fingerprint, r.name_expressions, r.extra_digest)
        try:
            if seen_key in _seen:
                return
        except TypeError:  # an unhashable name expression: recorded every time (the reader dedups)
            seen_key = None
    kernel, why_not = _kernel_table(request)
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


def _kernel_table(request: CompileRequest) -> tuple[dict[str, Any] | None, str]:
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
    names = []
    for name in request.name_expressions:
        if not isinstance(name, str):
            return None, "a name expression is bytes (a manifest holds str)"
        names.append(name)
    table: dict[str, Any] = {}
    for field, value in getattr(options, "__dict__", {}).items():
        if value is None or field.startswith("_"):
            continue
        encoded = _json_value(field, value)
        if encoded is None:
            return None, f"ProgramOptions.{field} is a {type(value).__name__}, which JSON cannot hold"
        table[field] = encoded
    found = kernel_names(code, None)
    kernel: dict[str, Any] = {
        "name": found[0] if found else (names[0] if names else "kernel"),
        "code": code,
        "code_type": request.code_type,
        "target": request.target_type,
        "options": table,
    }
    arch = table.pop("arch", None)
    if arch is not None:
        kernel["arch"] = arch
    if names:
        kernel["name_expressions"] = names
    return kernel, ""


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
