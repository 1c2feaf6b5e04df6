"""Snapshots and restores from many threads while the engine steps: no capsule is ever torn."""
from __future__ import annotations

import hashlib
import random
import threading
import time

import torch

from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.store import CapsuleStore
from flashrt_ros.runtime.toy import ToyEngine, live_bytes, toy_arena

MB = 1 << 20


def state_digest(parts: dict[str, bytes]) -> str:
    return hashlib.blake2b(b"".join(parts[k] for k in sorted(parts)), digest_size=16).hexdigest()


def capsule_digest(capsule) -> str:
    return state_digest({n: t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                         for n, t in capsule.data.items()})


def setup(max_len: int = 64):
    arena = toy_arena(max_len=max_len)
    engine = ToyEngine(arena)
    store = CapsuleStore(arena, "fp", device_budget_bytes=4 * MB, host_budget_bytes=4 * MB, disk_budget_bytes=0)
    committed = {state_digest(live_bytes(arena))}
    return arena, engine, store, committed


def engine_loop(gate, engine, store, committed, stop, arena, *, sleep: float = 0.0):
    with gate.generation():
        while not stop.is_set():
            with gate.step():
                if int(arena["meta.position"]) >= arena["kv.0"].shape[0] - 1:
                    arena.zero_()
                    store.ring.invalidate()
                store.ring.before_step()
                engine.step(yield_between=True)
                if sleep:
                    time.sleep(sleep)
                committed.add(state_digest(live_bytes(arena)))
                store.ring.record()


def test_concurrent_snapshot_and_restore_through_the_gate_never_tear():
    arena, engine, store, committed = setup()
    gate = BoundaryGate()
    stop = threading.Event()
    eng = threading.Thread(target=engine_loop, args=(gate, engine, store, committed, stop, arena), daemon=True)
    eng.start()
    digests: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(wid: int) -> None:
        rnd = random.Random(wid)
        try:
            for i in range(25):
                name = f"w{wid}-{i % 3}"
                cap = gate.run_at_boundary(lambda: store.snapshot(name, overwrite=True), timeout=10)
                d = gate.run_at_boundary(lambda: capsule_digest(store.get(name)), timeout=10)
                with lock:
                    digests.append(d)
                if rnd.random() < 0.3:
                    gate.run_at_boundary(lambda: store.restore(name), timeout=10)
                assert cap.name == name
        except BaseException as exc:      # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    stop.set()
    eng.join(10)
    assert not errors, errors
    assert len(digests) == 100
    assert set(digests) <= committed
    assert gate.boundaries > 0


def test_without_the_gate_snapshots_do_tear():
    """Control: the same workload minus the gate yields capsules that match no committed state."""
    arena, engine, store, committed = setup()
    gate = BoundaryGate()           # used by the engine only
    stop = threading.Event()
    eng = threading.Thread(target=engine_loop, args=(gate, engine, store, committed, stop, arena),
                           kwargs={"sleep": 0.0}, daemon=True)
    eng.start()
    torn = 0
    deadline = time.monotonic() + 5
    while torn == 0 and time.monotonic() < deadline:
        for i in range(20):
            cap = store.snapshot("raw", overwrite=True)
            torn += capsule_digest(cap) not in committed
    stop.set()
    eng.join(10)
    assert torn > 0
