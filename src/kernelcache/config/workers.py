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
    when none runs); 0/false/no/off: never; ``auto`` or unset (the default): on where the NVIDIA
    driver is.

    Auto by default because that is where it pays and only there: on the H200 host, 64 misses in
    a fresh process took 0.28x of cuda.core's loop with a warm server against 0.33x without
    (bench_cold.py --only b -K 64); where NVRTC initialises no driver a worker's start is cheap
    and the server gains nothing measurable, so it is not started there."""
    from kernelcache import config

    raw = config.env_get("KERNELCACHE_COMPILE_SERVER")
    value = (raw or "").strip().lower()
    if value in ("auto", ""):
        return os.path.exists(_DRIVER_NODE)
    if value in config._TRUE:
        return True
    if value in config._FALSE:
        return False
    raise config.ConfigError(
        f"KERNELCACHE_COMPILE_SERVER={config.shown(raw or '')}: use 1 (use the compile server), 0 (never) "
        "or auto (where the NVIDIA driver is, the default), or unset it"
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
