"""Child processes of the trust tests: run as ``python -c`` (a real separate interpreter each).

Every worker prints one JSON line with what it did, so the parent can count exactly.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings


def value_for(key: str, size: int) -> bytes:
    """The one right value of key: a reader can tell a wrong or torn value from it."""
    seed = key.encode()
    return (seed * (size // len(seed) + 1))[:size]


def write_keys(root: str, prefix: str, count: int, size: int, cap: int | None = None) -> None:
    """Write count distinct keys; print {"written": [...], "dropped": n} (dropped: a warning)."""
    from kernelcache import FileStreamProgramCache

    cache = FileStreamProgramCache(root, cap)
    written, dropped = [], 0
    for i in range(count):
        key = f"{prefix}-{i}"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            cache[key] = value_for(key, size)
        if seen:
            dropped += 1
        else:
            written.append(key)
    cache.close()
    print(json.dumps({"written": written, "dropped": dropped}))


def write_forever(root: str, prefix: str, size: int, cap: int | None, ready: str) -> None:
    """Write distinct keys until killed; touch ``ready`` once the first write is done."""
    from kernelcache import FileStreamProgramCache

    warnings.simplefilter("ignore")
    cache = FileStreamProgramCache(root, cap)
    i = 0
    while True:
        key = f"{prefix}-{i}"
        cache[key] = value_for(key, size)
        if i == 0:
            open(ready, "w").close()
        i += 1


def hold_single_flight(root: str, key_hex: str, hold_s: float) -> None:
    """Hold the single-flight lock of key_hex for hold_s seconds (as compile_program would)."""
    from kernelcache import FileStreamProgramCache
    from kernelcache.compile.flight import SingleFlight

    cache = FileStreamProgramCache(root)
    with SingleFlight(bytes.fromhex(key_hex), 30.0, lock_path=cache.lock_path(key_hex + ".lock")).hold() as outcome:
        print(json.dumps({"outcome": outcome, "t": time.time()}), flush=True)
        time.sleep(hold_s)
    print(json.dumps({"released": time.time()}), flush=True)


def contend(root: str, key_hex: str, rounds: int, marker: str) -> None:
    """Take one key's single-flight lock rounds times; inside, check nobody else is inside
    (an O_EXCL marker file). Print {"overlaps": n}: two holders at once."""
    from kernelcache import FileStreamProgramCache
    from kernelcache.compile.flight import SingleFlight

    cache = FileStreamProgramCache(root)
    overlaps = 0
    for _ in range(rounds):
        with SingleFlight(bytes.fromhex(key_hex), 60.0, lock_path=cache.lock_path(key_hex + ".lock")).hold() as outcome:
            assert outcome == "acquired", outcome
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                overlaps += 1
                continue
            os.close(fd)
            time.sleep(0.0005)
            os.unlink(marker)
    print(json.dumps({"overlaps": overlaps}))


def remove_locks_until(root: str, stop: str) -> None:
    """Remove idle lock files in a tight loop (as clear/prune/verify --fix do) until stop exists."""
    from kernelcache import FileStreamProgramCache

    cache = FileStreamProgramCache(root)
    removed = 0
    while not os.path.exists(stop):
        removed += cache.remove_idle_locks()
    print(json.dumps({"removed": removed}))


def main() -> None:
    fn = globals()[sys.argv[1]]
    args = [json.loads(a) for a in sys.argv[2:]]
    fn(*args)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    main()
