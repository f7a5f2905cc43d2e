"""``python -m kernelcache`` is the ``kernelcache`` command."""

from kernelcache.cli.main import main

main()
