"""Tier budgets, LRU demotion, pinning and promotion (CPU: device == host == CPU memory)."""
from __future__ import annotations

import pytest

from flashrt_ros.runtime.errors import BudgetExhausted, InvalidArgument, PinnedCapsule
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena


def setup(tmp_path=None, *, device_caps: float = 2, host_caps: float = 2, disk_caps: float = 10):
    arena = toy_arena()
    engine = ToyEngine(arena)
    engine.prefill(5)
    size = _capsule_size(arena)
    store = CapsuleStore(arena, "fp", device_budget_bytes=int(device_caps * size),
                         host_budget_bytes=int(host_caps * size), disk_budget_bytes=int(disk_caps * size),
                         directory=tmp_path)
    return arena, engine, store, size


def _capsule_size(arena) -> int:
    probe = CapsuleStore(arena, "fp", device_budget_bytes=1 << 30, host_budget_bytes=0, disk_budget_bytes=0)
    return probe.snapshot("probe").nbytes


def tiers(store):
    return {i.name: i.tier for i in store.list()}


def test_full_device_tier_demotes_least_recently_used_to_host_then_disk(tmp_path):
    arena, engine, store, size = setup(tmp_path)
    store.snapshot("a")
    store.snapshot("b")
    store.snapshot("c")
    assert tiers(store) == {"a": "host", "b": "device", "c": "device"}
    store.restore("b")                       # b becomes most recently used
    store.snapshot("d")
    assert tiers(store) == {"a": "host", "b": "device", "c": "host", "d": "device"}
    store.snapshot("e")
    assert tiers(store) == {"a": "disk", "b": "host", "c": "host", "d": "device", "e": "device"}
    stats = store.stats()
    assert (stats["device"]["bytes"], stats["host"]["bytes"], stats["disk"]["bytes"]) == (2 * size, 2 * size, size)


def test_demotion_and_promotion_keep_bytes_identical(tmp_path):
    arena, engine, store, size = setup(tmp_path, device_caps=1, host_caps=1)
    states = {}
    for name in ("a", "b", "c"):
        engine.step()
        states[name] = live_bytes(arena)
        store.snapshot(name)
    assert tiers(store) == {"a": "disk", "b": "host", "c": "device"}
    for name in ("a", "b", "c"):
        store.restore(name)
        assert live_bytes(arena) == states[name], name
    store.move("a", "device")
    assert store.get("a").tier == "device"
    store.restore("a")
    assert live_bytes(arena) == states["a"]
    assert all(store.verify(n).ok for n in states)


def test_restore_from_disk_promotes_to_host(tmp_path):
    arena, engine, store, size = setup(tmp_path)
    store.snapshot("a", tier="disk")
    assert store.get("a").data is None and store.get("a").on_disk
    engine.step()
    store.restore("a")
    assert store.get("a").tier == "host"


def test_pinned_capsules_are_never_demoted(tmp_path):
    arena, engine, store, size = setup(tmp_path)
    store.snapshot("a", pinned=True)
    store.snapshot("b")
    store.snapshot("c")
    assert tiers(store) == {"a": "device", "b": "host", "c": "device"}
    with pytest.raises(PinnedCapsule):
        store.drop("a")
    store.unpin("a")
    store.snapshot("d")
    assert tiers(store)["a"] == "host"


def test_budget_exhausted_leaves_store_unchanged():
    arena, engine, store, size = setup(None, device_caps=2, host_caps=1)   # no directory: no disk tier
    store.snapshot("a")
    store.snapshot("b")
    store.snapshot("c")
    before_stats = store.stats()
    before = [(i.name, i.tier, i.nbytes) for i in store.list()]
    ptrs = {n: store.get(n).payload.data_ptr() for n in ("a", "b", "c")}
    with pytest.raises(BudgetExhausted, match="nothing was changed"):
        store.snapshot("d")
    assert [(i.name, i.tier, i.nbytes) for i in store.list()] == before
    assert store.stats() == before_stats
    assert {n: store.get(n).payload.data_ptr() for n in ptrs} == ptrs
    assert "d" not in store


def test_tiers_full_of_pinned_capsules_refuse_a_snapshot(tmp_path):
    arena, engine, store, size = setup(tmp_path, device_caps=1, host_caps=1)
    store.snapshot("a", pinned=True)
    store.snapshot("h", tier="host", pinned=True)
    with pytest.raises(BudgetExhausted, match="pinned"):
        store.snapshot("b")
    assert tiers(store) == {"a": "device", "h": "host"}


def test_capsule_larger_than_any_budget_is_refused():
    arena, engine, store, size = setup(None, device_caps=0.5, host_caps=0.5)
    with pytest.raises(BudgetExhausted):
        store.snapshot("a")
    assert store.stats()["capsules"] == 0


def test_overwrite_reuses_the_budget_of_the_replaced_capsule():
    arena, engine, store, size = setup(None, device_caps=1.5, host_caps=0)
    store.snapshot("a")
    engine.step()
    store.snapshot("a", overwrite=True)       # old + new exceed the budget; the new one alone fits
    assert store.get("a").position == 6


def test_disk_tier_requires_a_directory():
    arena, engine, store, size = setup(None)
    with pytest.raises(InvalidArgument, match="no capsule directory"):
        store.snapshot("a", tier="disk")


def test_fork_into_a_full_tier_is_refused_without_changes():
    arena, engine, store, size = setup(None, device_caps=1, host_caps=0)
    store.snapshot("a")
    with pytest.raises(BudgetExhausted):
        store.fork("a", "b")
    assert tiers(store) == {"a": "device"}
