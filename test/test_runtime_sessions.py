"""Sessions time-share one arena through hidden parked capsules, without cross-talk."""
from __future__ import annotations

import pytest

from flashrt_ros.runtime.arena import POSITION
from flashrt_ros.runtime.errors import BudgetExhausted, InvalidArgument, InvalidName
from flashrt_ros.runtime.sessions import SessionManager
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

MB = 1 << 20


def setup(device: int = MB):
    arena = toy_arena()
    engine = ToyEngine(arena)
    store = CapsuleStore(arena, "fp", device_budget_bytes=device, host_budget_bytes=0, disk_budget_bytes=0)
    return arena, engine, store, SessionManager(store, initial="alice")


def test_sessions_swap_without_cross_talk():
    arena, engine, store, sessions = setup()
    engine.prefill(4)
    alice = live_bytes(arena)
    sessions.switch_to("bob")
    assert int(arena[POSITION]) == 0                    # a new session starts cold
    engine.prefill(7)
    bob = live_bytes(arena)
    assert sessions.switch_to("alice") == "bob"
    assert live_bytes(arena) == alice
    engine.prefill(2)
    alice = live_bytes(arena)
    sessions.switch_to("bob")
    assert live_bytes(arena) == bob
    sessions.switch_to("alice")
    assert live_bytes(arena) == alice
    assert sessions.current == "alice" and sessions.sessions() == ["alice", "bob"]


def test_parked_sessions_are_hidden_from_listing_and_names():
    arena, engine, store, sessions = setup()
    engine.prefill(2)
    store.snapshot("visible")
    sessions.switch_to("bob")
    assert [i.name for i in store.list()] == ["visible"]
    assert store.stats()["hidden"] == 1
    with pytest.raises(InvalidName):
        store.restore(".session.alice")


def test_new_session_can_start_from_a_capsule():
    arena, engine, store, sessions = setup()
    engine.prefill(3)
    store.snapshot("prefix")
    expected = live_bytes(arena)
    engine.prefill(2)
    sessions.switch_to("carol", from_capsule="prefix")
    assert live_bytes(arena) == expected
    assert store.get("prefix").position == 3          # the seed capsule stays


def test_close_frees_a_parked_session():
    arena, engine, store, sessions = setup()
    sessions.switch_to("bob")
    with pytest.raises(InvalidArgument, match="current"):
        sessions.close("bob")
    sessions.close("alice")
    assert sessions.sessions() == ["bob"] and store.stats()["capsules"] == 0
    sessions.switch_to("alice")
    assert int(arena[POSITION]) == 0                    # a closed session comes back cold


def test_switch_without_room_to_park_changes_nothing():
    arena, engine, store, sessions = setup(device=0)
    engine.prefill(3)
    before = live_bytes(arena)
    with pytest.raises(BudgetExhausted):
        sessions.switch_to("bob")
    assert sessions.current == "alice" and live_bytes(arena) == before
    assert sessions.sessions() == ["alice"]
