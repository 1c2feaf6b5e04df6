"""Requests from another thread (the ROS node) land between engine steps."""
import threading

import pytest

from flashrt_ros.engine import LLMEngine
from flashrt_ros.models.registry import load_model
from flashrt_ros.runtime.arena import BOUNDARY

PROMPT = "Threads meet the engine only at boundaries."


@pytest.fixture(scope="module")
def tiny():
    return load_model("random-llama-tiny", seed=1)


def make_engine(tiny) -> LLMEngine:
    model, tok, _, fp = tiny
    return LLMEngine(model, tok, max_context=160, prefill_chunk=16, fingerprint_inputs=fp)


def test_snapshot_from_another_thread_lands_at_a_boundary_and_reproduces_later_tokens(tiny):
    straight = make_engine(tiny)
    full = straight.generate(PROMPT, max_new_tokens=30, stop_ids=[]).token_ids

    engine = make_engine(tiny)
    reached = threading.Event()
    taken: dict = {}
    seen: list[int] = []

    def on_token(token: int, piece: str, _n: int) -> None:
        seen.append(token)
        if len(seen) == 6:
            reached.set()

    def requester() -> None:
        reached.wait(10)
        taken["info"] = engine.capsules.snapshot("from_thread", timeout=10)
        taken["seen_when_done"] = len(seen)

    thread = threading.Thread(target=requester)
    thread.start()
    result = engine.generate(PROMPT, max_new_tokens=30, stop_ids=[], on_token=on_token)
    thread.join(10)
    assert result.token_ids == full
    info = taken["info"]
    prompt_len = len(tiny[1].encode(PROMPT))
    # The capsule holds whole steps only: position counts consumed tokens, plus one pending.
    emitted_in_capsule = info.position - prompt_len + 1
    assert 6 <= emitted_in_capsule <= taken["seen_when_done"]
    engine.capsules.restore("from_thread")
    assert engine.transcript()[prompt_len:] == full[:emitted_in_capsule]
    rest = engine.generate([], max_new_tokens=30 - emitted_in_capsule, stop_ids=[]).token_ids
    assert rest == full[emitted_in_capsule:]


def test_restore_from_another_thread_cancels_the_running_generation(tiny):
    engine = make_engine(tiny)
    engine.generate(PROMPT, max_new_tokens=3, stop_ids=[])
    engine.capsules.snapshot("early")
    early_boundary = engine.capsules.get("early").boundary_id
    started = threading.Event()
    done: dict = {}

    def requester() -> None:
        started.wait(10)
        done["info"] = engine.capsules.restore("early", timeout=10)

    thread = threading.Thread(target=requester)
    thread.start()
    result = engine.generate([], max_new_tokens=200, stop_ids=[], on_token=lambda t, s, _n: started.set())
    thread.join(10)
    assert result.stop_reason == "cancelled" and len(result.token_ids) < 200
    assert int(engine.arena[BOUNDARY]) == early_boundary
    assert engine.capsules.verify("early", against_live=True).ok


def test_verbs_that_do_not_touch_the_arena_never_wait_for_a_step(tiny):
    engine = make_engine(tiny)
    engine.capsules.snapshot("idle")
    blocked = threading.Event()
    release = threading.Event()
    listed: dict = {}

    def slow_token(token: int, piece: str, _n: int) -> None:
        blocked.set()
        release.wait(10)          # hold the engine inside a step

    def lister() -> None:
        blocked.wait(10)
        listed["names"] = [c.name for c in engine.capsules.list()]
        engine.capsules.fork("idle", "idle_copy")
        listed["forked"] = True
        release.set()

    thread = threading.Thread(target=lister)
    thread.start()
    engine.generate(PROMPT, max_new_tokens=2, stop_ids=[], on_token=slow_token)
    thread.join(10)
    assert listed == {"names": ["idle"], "forked": True}


def test_a_second_driver_thread_is_refused_while_generating(tiny):
    from flashrt_ros.runtime.errors import Busy

    engine = make_engine(tiny)
    inside = threading.Event()
    release = threading.Event()
    outcome: dict = {}

    def hold(token: int, piece: str, _n: int) -> None:
        inside.set()
        release.wait(10)

    def intruder() -> None:
        inside.wait(10)
        try:
            engine.generate("me too", max_new_tokens=1)
        except Busy as exc:
            outcome["busy"] = exc.code
        release.set()

    thread = threading.Thread(target=intruder)
    thread.start()
    result = engine.generate(PROMPT, max_new_tokens=2, stop_ids=[], on_token=hold)
    thread.join(10)
    assert "busy" in outcome and len(result.token_ids) == 2
