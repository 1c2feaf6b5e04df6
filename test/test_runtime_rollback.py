"""The rollback ring: order, depth, byte exactness, and safety after outside writes."""
from __future__ import annotations

import pytest

from flashrt_ros.runtime.arena import POSITION
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.runtime.rollback import RollbackRing
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

MB = 1 << 20


def commit_step(engine: ToyEngine, store: CapsuleStore) -> None:
    """What an engine does per step: seed a pending timeline start, step, record the boundary."""
    store.ring.before_step()
    engine.step()
    store.ring.record()


def recorded_run(depth: int = 4, steps: int = 6):
    arena = toy_arena()
    engine = ToyEngine(arena)
    store = CapsuleStore(arena, "fp", device_budget_bytes=MB, host_budget_bytes=MB, disk_budget_bytes=0,
                         rollback_depth=depth)
    store.ring.record()
    history = [live_bytes(arena)]
    for _ in range(steps):
        commit_step(engine, store)
        history.append(live_bytes(arena))
    return arena, engine, store, history


def test_rollback_restores_each_earlier_boundary_byte_exactly():
    arena, engine, store, history = recorded_run(depth=4, steps=6)
    assert store.ring.available == 4
    assert store.rollback(1) == 5
    assert live_bytes(arena) == history[5]
    assert store.rollback(2) == 3
    assert live_bytes(arena) == history[3]
    assert store.ring.available == 1


def test_rollback_zero_discards_unrecorded_work():
    arena, engine, store, history = recorded_run()
    engine.step()
    assert store.rollback(0) == 6
    assert live_bytes(arena) == history[6]


def test_rolled_back_state_continues_identically():
    arena, engine, store, history = recorded_run(depth=3, steps=6)
    store.rollback(3)
    for _ in range(3):
        engine.step()
    assert live_bytes(arena) == history[6]


def test_rollback_beyond_depth_says_how_many_are_available():
    arena, engine, store, history = recorded_run(depth=4, steps=6)
    with pytest.raises(InvalidArgument, match="only 4 available"):
        store.rollback(5)
    assert live_bytes(arena) == history[6]


def test_ring_skips_append_only_buffers_and_records_without_allocating():
    arena = toy_arena()
    ring = RollbackRing(arena, depth=2)
    assert not any(p.name.startswith("kv") for p in ring.plan.placements)
    storage = ring._slots.data_ptr()
    ToyEngine(arena).step()
    ring.record()
    ring.record()
    ring.record()
    assert ring._slots.data_ptr() == storage
    assert ring.nbytes == 3 * ring.plan.nbytes


def test_restore_invalidates_history_and_seeds_the_restored_state():
    arena, engine, store, history = recorded_run(depth=4, steps=3)
    store.rollback(2)
    store.snapshot("at1")
    store.restore("at1")
    assert store.ring.available == 0
    for _ in range(2):
        commit_step(engine, store)
    assert store.rollback(2) == 1
    assert live_bytes(arena) == history[1]


def test_restore_of_a_shorter_capsule_makes_old_kv_rows_unreachable():
    arena, engine, store, history = recorded_run(depth=4, steps=2)
    store.snapshot("early")                          # position 2
    for _ in range(3):
        commit_step(engine, store)                          # positions 3, 4, 5
    store.restore("early")                           # KV rows 2.. will be rewritten from here
    for _ in range(3):
        commit_step(engine, store)
    assert store.rollback(3) == 2                    # back to the restored state, not to stale history
    assert store.verify("early", against_live=True).ok
    with pytest.raises(InvalidArgument, match="0 available"):
        store.rollback(1)


def test_shrunken_length_without_invalidate_is_refused():
    arena, engine, store, history = recorded_run(depth=4, steps=4)
    arena[POSITION].fill_(1)                         # an outside crop that forgot invalidate()
    with pytest.raises(InvalidArgument, match="dropped to 1"):
        store.rollback(1)
    assert int(arena[POSITION]) == 1


def test_negative_steps_are_refused():
    arena, engine, store, history = recorded_run()
    with pytest.raises(InvalidArgument):
        store.rollback(-1)
    assert live_bytes(arena) == history[-1]


def test_restore_records_the_timeline_start_lazily_before_the_next_step():
    arena, engine, store, history = recorded_run(depth=4, steps=3)
    store.snapshot("at3")
    commit_step(engine, store)
    store.restore("at3")
    assert store.ring.available == 0
    commit_step(engine, store)         # before_step records the restored state first
    assert store.ring.available == 1
    assert store.rollback(1) == 3
    assert live_bytes(arena) == history[3]


def test_rollback_zero_right_after_restore_keeps_the_restored_state():
    arena, engine, store, history = recorded_run(depth=4, steps=3)
    store.snapshot("at3")
    commit_step(engine, store)
    store.restore("at3")
    assert store.rollback(0) == 3
    assert live_bytes(arena) == history[3]
