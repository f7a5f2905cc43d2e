"""The settings of the compile server (compile/server.py): whether compile_many uses one, and
how long it waits for the next process before it exits."""

from __future__ import annotations

import math
import os

# On a GPU host NVRTC initialises the CUDA driver in each process's first compile (~0.2 s of a
# worker's start): the server's warm workers have paid it. /dev/nvidiactl is the driver's
# control node: present where the driver is loaded, on the host and in GPU containers.
_DRIVER_NODE = "/dev/nvidiactl"
DEFAULT_IDLE_S = 300.0


def compile_server() -> bool:
    """``KERNELCACHE_COMPILE_SERVER``: 1/true/yes/on uses the node's compile server (starting it
    when none runs); ``auto``: on where the NVIDIA driver is; 0/false/no/off or unset: never.

    Off by default for now: the server has not yet been measured on a GPU host, where it is
    meant to pay (the H200 host was not lent when it was written); ``auto`` is the default
    once it has been."""
    from kernelcache import config

    raw = config.env_get("KERNELCACHE_COMPILE_SERVER")
    value = (raw or "").strip().lower()
    if value == "auto":
        return os.path.exists(_DRIVER_NODE)
    if value in config._TRUE:
        return True
    if value in config._FALSE:  # "" (unset) among them
        return False
    raise config.ConfigError(
        f"KERNELCACHE_COMPILE_SERVER={config.shown(raw or '')}: use 1 (use the compile server), 0 (never) "
        "or auto (where the NVIDIA driver is), or unset it"
    )


def compile_server_idle_s() -> float:
    """``KERNELCACHE_COMPILE_SERVER_IDLE``: seconds a compile server waits for a process to ask
    for a worker before it exits (with its workers), default 300."""
    from kernelcache import config

    raw = config.env_get("KERNELCACHE_COMPILE_SERVER_IDLE") or ""
    try:
        value = float(raw) if raw.strip() else DEFAULT_IDLE_S
    except ValueError:
        value = math.nan
    if not 0 < value <= 86400 * 7:
        raise config.ConfigError(
            f"KERNELCACHE_COMPILE_SERVER_IDLE={config.shown(raw)}: use a number of seconds above 0 "
            "and at most a week (604800), e.g. 300, or unset it"
        )
    return value
