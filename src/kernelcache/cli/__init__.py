"""The kernelcache command-line tools (entry point: kernelcache.cli.main:main)."""
