"""GuardedCache: every rule, with deterministic hand-offs (Events/Barriers with timeouts)."""

from __future__ import annotations

import random
import threading
import warnings

import pytest

from kernelcache import CacheClearedDuringBuild, DeviceDestroyedDuringBuild, GuardedCache

T = 10  # seconds: a deadlock fails the test instead of hanging it


class Value:
    _ids = 0

    def __init__(self, tag: str = "") -> None:
        Value._ids += 1
        self.id = Value._ids
        self.tag = tag
        self.destroyed = 0


class Recorder:
    """A destroy function that records, and can check it is not called under the lock."""

    def __init__(self, cache_ref: list | None = None) -> None:
        self.destroyed: list[Value] = []
        self.lock = threading.Lock()
        self.cache_ref = cache_ref

    def __call__(self, v: Value) -> None:
        if self.cache_ref:
            len(self.cache_ref[0])  # calls back into the cache: deadlocks if under its lock
        v.destroyed += 1
        with self.lock:
            self.destroyed.append(v)


def run(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def test_hit_returns_the_same_object() -> None:
    cache = GuardedCache(Recorder())
    v = cache.find_or_build("k", Value)
    assert cache.find_or_build("k", lambda: pytest.fail("built twice")) is v
    assert len(cache) == 1


def test_build_and_destroy_never_run_under_the_lock() -> None:
    ref: list = []
    rec = Recorder(ref)
    cache: GuardedCache[Value] = GuardedCache(rec)
    ref.append(cache)

    def build() -> Value:
        len(cache)  # would deadlock if build ran under the cache lock
        cache.find_or_build("other", Value)
        return Value()

    cache.find_or_build("k", build)
    cache.clear()  # destroy calls len(cache): must not deadlock
    assert len(rec.destroyed) == 2


def test_concurrent_misses_build_once_and_share_the_value() -> None:
    cache = GuardedCache(Recorder())
    started, release = threading.Event(), threading.Event()
    builds = []

    def build() -> Value:
        builds.append(1)
        started.set()
        assert release.wait(T)
        return Value()

    results: list[Value] = []
    owner = run(lambda: results.append(cache.find_or_build("k", build)))
    assert started.wait(T)
    waiters = [run(lambda: results.append(cache.find_or_build("k", build))) for _ in range(5)]
    release.set()
    for t in [owner, *waiters]:
        t.join(T)
    assert len(builds) == 1 and len(results) == 6 and len({id(r) for r in results}) == 1


def test_build_exception_is_shared_and_nothing_is_cached() -> None:
    cache = GuardedCache(Recorder())
    started, release = threading.Event(), threading.Event()

    def failing() -> Value:
        started.set()
        assert release.wait(T)
        raise KeyError("boom")

    errors: list[BaseException] = []

    def call() -> None:
        try:
            cache.find_or_build("k", failing)
        except KeyError as exc:
            errors.append(exc)

    owner = run(call)
    assert started.wait(T)
    waiter = run(call)
    release.set()
    owner.join(T)
    waiter.join(T)
    assert len(errors) == 2 and all(str(e) == "'boom'" for e in errors)
    assert len(cache) == 0
    assert cache.find_or_build("k", Value) is not None  # a later call retries


def test_different_keys_and_devices_do_not_wait() -> None:
    cache = GuardedCache(Recorder())
    started, release = threading.Event(), threading.Event()

    def slow() -> Value:
        started.set()
        assert release.wait(T)
        return Value()

    t = run(lambda: cache.find_or_build("slow", slow, device_id=0))
    assert started.wait(T)
    done = threading.Event()
    run(lambda: (cache.find_or_build("fast", Value, device_id=1), done.set()))
    assert done.wait(T), "a miss of another key waited for an unrelated build"
    release.set()
    t.join(T)


def test_evict_device_destroys_its_values_and_bumps_epoch_even_when_empty() -> None:
    rec = Recorder()
    cache = GuardedCache(rec)
    a = cache.find_or_build("a", Value, device_id=0)
    b = cache.find_or_build("b", Value, device_id=1)
    c = cache.find_or_build("c", Value)  # no device: survives eviction
    cache.evict_device(0)
    assert rec.destroyed == [a] and len(cache) == 2
    assert cache.find_or_build("b", Value, device_id=1) is b
    assert cache.find_or_build("c", Value) is c
    # Eviction of a device with no entries still invalidates a build in flight for it.
    started, release = threading.Event(), threading.Event()

    def build() -> Value:
        started.set()
        assert release.wait(T)
        return Value("stale")

    errors: list[BaseException] = []

    def call() -> None:
        try:
            cache.find_or_build("d", build, device_id=7)
        except DeviceDestroyedDuringBuild as exc:
            errors.append(exc)

    t = run(call)
    assert started.wait(T)
    cache.evict_device(7)
    release.set()
    t.join(T)
    assert len(errors) == 1 and errors[0].device_id == 7
    assert rec.destroyed[-1].tag == "stale" and len(cache) == 2


@pytest.mark.parametrize("invalidated", [True, False])
def test_clear_during_build(invalidated: bool) -> None:
    rec = Recorder()
    cache = GuardedCache(rec, invalidated_by_clear=invalidated)
    started, release = threading.Event(), threading.Event()

    def build() -> Value:
        started.set()
        assert release.wait(T)
        return Value("in-flight")

    out: list[object] = []

    def call() -> None:
        try:
            out.append(cache.find_or_build("k", build))
        except CacheClearedDuringBuild as exc:
            out.append(exc)

    t = run(call)
    assert started.wait(T)
    cache.clear()
    release.set()
    t.join(T)
    if invalidated:
        assert isinstance(out[0], CacheClearedDuringBuild)
        assert rec.destroyed and rec.destroyed[0].tag == "in-flight" and len(cache) == 0
    else:
        assert isinstance(out[0], Value) and len(cache) == 1 and not rec.destroyed


def test_destroy_errors_every_victim_tried_first_error_raised() -> None:
    seen: list[str] = []

    def destroy(v: Value) -> None:
        seen.append(v.tag)
        if v.tag in ("a", "b"):
            raise ValueError(f"destroy {v.tag}")

    cache = GuardedCache(destroy)
    for tag in "abc":
        cache.find_or_build(tag, lambda tag=tag: Value(tag))
    with pytest.raises(ValueError, match="destroy"):
        cache.clear()
    assert sorted(seen) == ["a", "b", "c"] and len(cache) == 0


def test_destroy_error_on_discard_path_is_dropped_for_the_discard_reason() -> None:
    def destroy(v: Value) -> None:
        raise OSError("destroy failed")

    cache = GuardedCache(destroy, invalidated_by_clear=True)
    started, release = threading.Event(), threading.Event()

    def build() -> Value:
        started.set()
        assert release.wait(T)
        return Value()

    errors: list[BaseException] = []

    def call() -> None:
        try:
            cache.find_or_build("k", build, device_id=0)
        except BaseException as exc:
            errors.append(exc)

    t = run(call)
    assert started.wait(T)
    cache.evict_device(0)
    release.set()
    t.join(T)
    assert isinstance(errors[0], DeviceDestroyedDuringBuild)


def test_lease_defers_destroy_until_the_last_lease_ends() -> None:
    rec = Recorder()
    cache = GuardedCache(rec)
    with cache.lease("k", Value) as v:
        with cache.lease("k", Value) as v2:
            assert v2 is v
            cache.clear()
            assert len(cache) == 0 and v.destroyed == 0  # unlinked at once, not destroyed
            fresh = cache.find_or_build("k", Value)
            assert fresh is not v  # a new look-up builds a fresh one
        assert v.destroyed == 0  # one lease still held
    assert v.destroyed == 1


def test_lease_destroys_exactly_once_even_if_the_block_raises() -> None:
    rec = Recorder()
    cache = GuardedCache(rec)
    with pytest.raises(RuntimeError), cache.lease("k", Value, device_id=3) as v:
        cache.evict_device(3)
        raise RuntimeError("user code failed")
    assert v.destroyed == 1 and rec.destroyed == [v]
    cache.clear()
    assert v.destroyed == 1


def test_deferred_destroy_error_is_a_warning_not_raised() -> None:
    def destroy(v: Value) -> None:
        raise OSError("cannot unload")

    cache = GuardedCache(destroy)
    with pytest.warns(RuntimeWarning, match="deferred destroy failed"):  # noqa: SIM117
        with cache.lease("k", Value):
            cache.clear()


def test_leasing_waiter_never_gets_a_destroyed_value() -> None:
    # Race: a clear lands between the builder's install and a waiter's wake-up.
    rec = Recorder()
    cache = GuardedCache(rec)
    started, release = threading.Event(), threading.Event()

    def build() -> Value:
        started.set()
        assert release.wait(T)
        return Value()

    got: list[tuple[Value, int]] = []

    def waiter() -> None:
        with cache.lease("k", build) as v:
            got.append((v, v.destroyed))

    owner = run(lambda: cache.find_or_build("k", build))
    assert started.wait(T)
    w = run(waiter)
    release.set()
    owner.join(T)
    cache.clear()
    w.join(T)
    assert got and got[0][1] == 0


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        GuardedCache(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("use_leases", [True, False])
def test_stress_builds_equal_destroys_plus_live_and_no_use_after_destroy(use_leases: bool) -> None:
    rec = Recorder()
    builds: list[Value] = []
    builds_lock = threading.Lock()
    cache = GuardedCache(rec, invalidated_by_clear=True)
    violations: list[str] = []

    def build(tag: str) -> Value:
        v = Value(tag)
        with builds_lock:
            builds.append(v)
        return v

    def use(v: Value) -> None:
        for _ in range(20):  # "use" the value for a while; it must stay alive
            if v.destroyed:
                violations.append(f"value {v.id} used after destroy")
                return

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(3000):
            key = f"k{rnd.randrange(16)}"
            dev = rnd.randrange(4)
            op = rnd.random()
            try:
                if op < 0.02:
                    cache.clear()
                elif op < 0.04:
                    cache.evict_device(rnd.randrange(4))
                elif use_leases:
                    with cache.lease(key, lambda k=key: build(k), device_id=dev) as v:
                        use(v)
                else:
                    cache.find_or_build(key, lambda k=key: build(k), device_id=dev)
            except (DeviceDestroyedDuringBuild, CacheClearedDuringBuild):
                pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads = [run(worker, s) for s in range(8)]
        for t in threads:
            t.join(120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not violations, violations[:3]
    assert all(v.destroyed <= 1 for v in builds), "a value was destroyed twice"
    assert len(builds) == len(rec.destroyed) + len(cache)


def test_stress_detects_use_after_destroy_without_leases() -> None:
    """The stress test above can fail: without leases, a concurrent clear destroys values in use."""
    rec = Recorder()
    cache = GuardedCache(rec)
    hit = threading.Event()
    stop = threading.Event()

    def user() -> None:
        while not stop.is_set() and not hit.is_set():
            v = cache.find_or_build("k", Value)
            for _ in range(200):
                if v.destroyed:
                    hit.set()
                    return

    def clearer() -> None:
        while not stop.is_set() and not hit.is_set():
            cache.clear()

    threads = [run(user), run(user), run(clearer)]
    hit.wait(30)
    stop.set()
    for t in threads:
        t.join(T)
    assert hit.is_set(), "expected plain find_or_build to expose a destroyed value under concurrent clear"
