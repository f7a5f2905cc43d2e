"""What every ``kernelcache`` command shares: the common options, one-line errors, opening the cache."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from kernelcache import config
from kernelcache.stores.file import dircap
from kernelcache.stores.file.marker import require_cache_root
from kernelcache.stores.file.store import FileStreamProgramCache


def _allow_shared(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    # The flag means exactly "KERNELCACHE_ALLOW_SHARED=1" for this command: setting the
    # variable reaches every store the command opens, in this process and in the worker
    # processes of `warm` (they inherit the environment).
    if value:
        os.environ["KERNELCACHE_ALLOW_SHARED"] = "1"


def CACHE_DIR_OPTION(f: Any) -> Any:  # noqa: N802 - used like the other option constants
    """--cache-dir and --allow-shared: every command that opens a cache takes both."""
    f = ALLOW_SHARED_OPTION(f)
    return click.option(
        "--cache-dir",
        default=None,
        metavar="DIR",
        callback=_expand_user,
        help="Cache directory (default: KERNELCACHE_DIR or the user cache dir).",
    )(f)


def _expand_user(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # --cache-dir=~/kc reaches us unexpanded (the shell expands a ~ only at the start of a
    # word): it means the home's kc, never a directory named "~" in the current directory.
    return os.path.expanduser(value) if value is not None else None


ALLOW_SHARED_OPTION = click.option(
    "--allow-shared",
    is_flag=True,
    expose_value=False,
    callback=_allow_shared,
    help="Accept a group-shared team cache directory (same as KERNELCACHE_ALLOW_SHARED=1).",
)


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")


class UserError(click.ClickException):
    """A problem with the user's input: one line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        for line in self.format_message().splitlines() or [""]:  # several problems: one line each
            click.echo(f"kernelcache: error: {line}", err=True)


class Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            # `kernelcache ls | head -1`: the reader has what it wanted. Not an error; and the
            # interpreter's exit flush must not hit the closed pipe again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(0) from None
        except (ValueError, OSError, KeyError) as exc:
            # Expected failures (bad manifest, unreadable dir...) are one line, not a traceback.
            text = str(exc).strip()
            # A ConfigError names each bad variable on a line of its own; other errors: their first line.
            shown = text if isinstance(exc, config.ConfigError) else text.splitlines()[0] if text else ""
            raise UserError(shown or type(exc).__name__) from exc


class Declined(click.ClickException):
    """The user did not confirm: one line on stderr, exit code 1 (not a usage error)."""

    exit_code = 1

    def show(self, file: Any = None) -> None:
        click.echo(f"kernelcache: {self.format_message()}", err=True)


def open_cache(
    cache_dir: str | None, sweep: bool = True, create: bool = False, removes: str | None = None
) -> FileStreamProgramCache:
    """The file cache the command works on. Only commands that write (demo, warm) create
    it: a mistyped --cache-dir must be an error, not a new empty cache reporting zeros, and
    a reading command creates nothing anywhere. ``removes``: the command (named so) deletes
    files, so the directory must prove it is a cache root first (stores/file/marker.py)."""
    root = os.path.abspath(cache_dir if cache_dir is not None else config.cache_dir())
    named = _named(cache_dir, root)
    if not create and not os.path.isdir(root):
        if os.path.exists(root):
            raise UserError(f"{root}{named} is not a directory: give the cache directory")
        raise UserError(f"no cache at {root}{named}: the directory does not exist (nothing was created)")
    if removes is not None:
        require_cache_root(root, removes)
    # The start-up sweep of stale temp files is a removal: only the commands that remove do
    # it (not verify, which reports them; not a reading command, which changes nothing).
    # The cap is the default cache's (KERNELCACHE_MAX_SIZE, else the directory's), so that stats shows it.
    # create=False: a directory without a tree is an empty cache, and stays as it is.
    tmp_max_age_s = None if sweep and (create or removes is not None) else float("inf")
    return FileStreamProgramCache(root, dircap.cap_for(root)[0], tmp_max_age_s=tmp_max_age_s, create=create)


def _named(cache_dir: str | None, root: str) -> str:
    """Where the directory came from, for an error message."""
    if cache_dir is not None:
        return " (--cache-dir)"
    return " (KERNELCACHE_DIR)" if config.cache_dir_is_from_env(root) else ""


def emit(data: Any, as_json: bool, render: Any) -> None:
    if as_json:
        click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        render(data)

