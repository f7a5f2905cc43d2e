"""The ``kernelcache`` command: the demo and the tools to run a cache in production.

Bad input gives one clear line on stderr and exit code 2, never a traceback. Each command
family lives in a module of its own; this module is the group and the registration.
"""

from __future__ import annotations

import click

from kernelcache import config
from kernelcache.cli import compile_commands, entry_commands
from kernelcache.cli.bundle import bundle, import_cmd
from kernelcache.cli.common import ALLOW_SHARED_OPTION, Group
from kernelcache.cli.setup import config_group, init
from kernelcache.cli.stats import stats


@click.group(cls=Group)
@click.version_option(package_name="kernelcache")
@ALLOW_SHARED_OPTION  # before the command too: `kernelcache --allow-shared stats`
def main() -> None:
    """kernelcache: compile CUDA kernels once, reuse them everywhere."""
    config.check()  # a bad KERNELCACHE_* variable is one line before anything is opened


for _command in (
    *compile_commands.COMMANDS,
    stats,
    *entry_commands.COMMANDS,
    config_group,
    init,
    bundle,
    import_cmd,
):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
