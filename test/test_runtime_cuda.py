"""The capsule runtime on a CUDA arena: pinned host tier, fused copies, cross-device moves.

These paths do not exist on a CPU-only machine, so the module is skipped
there; the CPU behaviour of the same code is covered by the other
``test_runtime_*`` files.
"""
from __future__ import annotations

import pytest
import torch

from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MB = 1 << 20


def make(tmp_path, **kw):
    arena = toy_arena(device="cuda", max_len=64)
    engine = ToyEngine(arena)
    engine.prefill(9)
    store = CapsuleStore(arena, "fp-cuda", device_budget_bytes=kw.get("device", MB), host_budget_bytes=MB,
                         disk_budget_bytes=MB, directory=tmp_path)
    return arena, engine, store


def test_cuda_restore_from_every_tier_is_byte_exact_in_place(tmp_path):
    arena, engine, store = make(tmp_path)
    ptrs = {n: arena[n].data_ptr() for n in arena}
    expected = live_bytes(arena)
    store.snapshot("dev")
    store.snapshot("host", tier="host")
    store.snapshot("disk", tier="disk")
    assert store.get("dev").payload.is_cuda and store.get("host").payload.is_pinned()
    for name in ("dev", "host", "disk"):
        engine.prefill(3)
        store.restore(name)
        torch.cuda.synchronize()
        assert live_bytes(arena) == expected, name
    assert {n: arena[n].data_ptr() for n in arena} == ptrs


def test_cuda_device_snapshot_defers_hashing(tmp_path):
    arena, engine, store = make(tmp_path)
    c = store.snapshot("a")
    assert not c.hashed
    assert store.verify("a").hashed_now and store.verify("a").ok
    assert store.verify("a", against_live=True).ok


def test_cuda_demotion_chain_and_disk_reload_keep_bytes(tmp_path):
    arena, engine, store = make(tmp_path)
    size = store.snapshot("probe").nbytes
    store.drop("probe")
    small = CapsuleStore(arena, "fp-cuda", device_budget_bytes=size, host_budget_bytes=size,
                         disk_budget_bytes=4 * size, directory=tmp_path)
    states = {}
    for name in ("a", "b", "c"):
        states[name] = live_bytes(arena)
        small.snapshot(name)
        arena["rec.0"].add_(1.0)        # a different state of the same size
    assert [i.tier for i in small.list()] == ["disk", "host", "device"]
    for name in ("a", "b", "c"):
        small.restore(name)
        torch.cuda.synchronize()
        assert live_bytes(arena) == states[name], name
    fresh = CapsuleStore(arena, "fp-cuda", device_budget_bytes=MB, host_budget_bytes=MB, disk_budget_bytes=MB,
                         directory=tmp_path)
    fresh.load("a", tier="device")
    fresh.restore("a")
    torch.cuda.synchronize()
    assert live_bytes(arena) == states["a"]


def test_cuda_rollback_ring_is_byte_exact(tmp_path):
    arena, engine, store = make(tmp_path)
    store.ring.record()
    history = [live_bytes(arena)]
    for _ in range(4):
        engine.step()
        store.ring.record()
        history.append(live_bytes(arena))
    assert store.rollback(3) == 10
    torch.cuda.synchronize()
    assert live_bytes(arena) == history[1]


def test_cuda_groups_restore_uses_partial_copies(tmp_path):
    arena, engine, store = make(tmp_path)
    store.snapshot("a")
    rec = arena["rec.0"].clone()
    engine.step()
    store.restore("a", groups=["recurrent"])
    assert torch.equal(arena["rec.0"], rec)
    assert int(arena["meta.position"]) == 10
