"""Snapshot / restore / fork / verify on the toy arena (CPU)."""
from __future__ import annotations

import pytest
import torch

from flashrt_ros.runtime.arena import BOUNDARY, POSITION, BufferSpec, StateArena, core_meta_specs
from flashrt_ros.runtime.copyplan import CopyPlan, gather
from flashrt_ros.runtime.errors import AlreadyExists, CapsuleNotFound, InvalidArgument, InvalidName
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

MB = 1 << 20


def make(prefill: int = 5, **kw):
    arena = toy_arena()
    engine = ToyEngine(arena)
    engine.prefill(prefill)
    store = CapsuleStore(arena, "fp-test", device_budget_bytes=kw.get("device", MB),
                         host_budget_bytes=kw.get("host", MB), disk_budget_bytes=0)
    return arena, engine, store


def test_restore_is_byte_exact_for_every_buffer():
    arena, engine, store = make()
    before = live_bytes(arena)
    store.snapshot("a")
    for _ in range(4):
        engine.step()
    assert live_bytes(arena) != before
    store.restore("a")
    after = live_bytes(arena)
    assert after.keys() == before.keys()
    for name in before:
        assert after[name] == before[name], name


def test_restore_keeps_tensor_addresses():
    arena, engine, store = make()
    ptrs = {n: arena[n].data_ptr() for n in arena}
    block_ptr = arena.block.data_ptr()
    store.snapshot("a")
    engine.step()
    store.restore("a")
    assert arena.block.data_ptr() == block_ptr
    assert {n: arena[n].data_ptr() for n in arena} == ptrs


def test_restored_state_continues_identically():
    arena, engine, store = make()
    store.snapshot("a")
    tokens = [engine.step() for _ in range(6)]
    final = live_bytes(arena)
    store.restore("a")
    assert [engine.step() for _ in range(6)] == tokens
    assert live_bytes(arena) == final


def test_capsule_metadata_reads_position_and_boundary():
    arena, engine, store = make(prefill=7)
    c = store.snapshot("a", session="s1")
    assert (c.position, c.boundary_id, c.session, c.tier) == (7, 7, "s1", "device")
    assert c.extents["kv.0"] == 7 and c.extents["rec.0"] is None
    assert c.data["kv.0"].shape == (7, 2, 4) and c.data["kvh.1"].shape == (2, 7, 4)
    info = c.info()
    assert info.name == "a" and not hasattr(info, "data")
    assert [i.name for i in store.list()] == ["a"]


def test_device_snapshot_is_hashed_when_taken_on_a_cpu_arena():
    arena, engine, store = make()
    c = store.snapshot("a")
    assert c.hashed and set(c.buffer_hashes) == set(arena)
    first = store.verify("a")
    assert first.ok and first.verified and not first.hashed_now and first.mismatched == ()


def test_without_hashes_at_snapshot_the_first_verify_is_unverified_then_compares():
    arena, engine, store = make()
    store.hash_at_snapshot = False
    c = store.snapshot("a")
    assert not c.hashed and c.buffer_hashes == {}
    first = store.verify("a")
    assert not first.ok and not first.verified and first.hashed_now and c.hashed
    second = store.verify("a")
    assert second.ok and second.verified and second.mismatched == ()


def test_verify_detects_corrupted_stored_bytes():
    arena, engine, store = make()
    c = store.snapshot("a")
    store.verify("a")
    c.data["rec.1"].view(-1)[3] += 1.0
    report = store.verify("a")
    assert not report.ok and report.mismatched == ("rec.1",)


def test_verify_against_live_lists_differing_buffers():
    arena, engine, store = make()
    store.snapshot("a")
    assert store.verify("a", against_live=True).ok
    arena["rec.0"].view(-1)[0] += 1.0
    report = store.verify("a", against_live=True)
    assert report.mismatched == ("rec.0",)
    engine.step()
    assert set(store.verify("a", against_live=True).mismatched) >= {"meta.position", "kv.0", "kvh.1"}


def test_fork_is_independent_of_its_source():
    arena, engine, store = make()
    store.snapshot("a")
    fork = store.fork("a", "b")
    a = store.get("a")
    assert fork.payload.data_ptr() != a.payload.data_ptr()
    original = {n: t.clone() for n, t in fork.data.items()}
    a.data["rec.0"].fill_(9.0)
    store.drop("a")
    assert all(torch.equal(fork.data[n], original[n]) for n in original)
    engine.step()
    store.restore("b")
    assert store.verify("b", against_live=True).ok


def test_groups_restricted_restore_touches_only_those_groups():
    arena, engine, store = make()
    store.snapshot("a")
    engine.step()
    engine.step()
    advanced = live_bytes(arena)
    store.restore("a", groups=["recurrent"])
    now = live_bytes(arena)
    store.restore("a")
    snap = live_bytes(arena)
    for name in arena:
        expect = snap if arena.spec(name).group == "recurrent" else advanced
        assert now[name] == expect[name], name


def test_kv_only_restore_of_kv_and_meta_leaves_recurrent_state_live():
    arena, engine, store = make()
    store.snapshot("a")
    engine.step()
    rec_after = arena["rec.0"].clone()
    store.restore("a", groups={"kv", "meta"})
    assert int(arena[POSITION]) == 5
    assert torch.equal(arena["rec.0"], rec_after)


def test_unknown_group_is_refused():
    arena, engine, store = make()
    store.snapshot("a")
    with pytest.raises(InvalidArgument, match="unknown groups"):
        store.restore("a", groups=["nope"])


def test_snapshot_name_collisions_and_missing_names():
    arena, engine, store = make()
    store.snapshot("a")
    with pytest.raises(AlreadyExists):
        store.snapshot("a")
    engine.step()
    assert store.snapshot("a", overwrite=True).position == 6
    assert store.stats()["device"]["count"] == 1
    with pytest.raises(CapsuleNotFound):
        store.restore("missing")
    with pytest.raises(InvalidName):
        store.snapshot("../evil")


def test_full_live_extents_copy_as_one_block_copy():
    specs = core_meta_specs() + [
        BufferSpec("kv", (8, 3), torch.float32, group="kv", live_axis=0, length_from=POSITION, append_only=True),
        BufferSpec("rec", (5,), torch.float64, group="recurrent"),
        BufferSpec("rng", (16,), torch.uint8, group="rng"),
    ]
    arena = StateArena(specs)
    arena[POSITION].fill_(8)
    plan = CopyPlan.build(arena, {"meta.position": None, "meta.boundary": None, "kv": 8, "rec": None, "rng": None})
    assert len(plan.copies()) == 1
    payload = torch.empty(plan.nbytes, dtype=torch.uint8)
    assert gather(arena, plan, payload) == 1
    assert CopyPlan.build(arena, {"kv": 4}).copies().__len__() == 2      # partial KV ends the run
    unmerged = CopyPlan.build(arena, {"kv": 8}, merge=False)
    assert len(unmerged.copies()) == len(specs)


def test_zero_length_live_extent_round_trips():
    arena = toy_arena()
    store = CapsuleStore(arena, "fp", device_budget_bytes=MB, host_budget_bytes=MB, disk_budget_bytes=0)
    c = store.snapshot("empty")
    assert c.data["kv.0"].shape == (0, 2, 4)
    ToyEngine(arena).prefill(3)
    store.restore("empty")
    assert int(arena[POSITION]) == 0 and int(arena[BOUNDARY]) == 0
    assert store.verify("empty", against_live=True).ok
