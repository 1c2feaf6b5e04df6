"""Interrupt-and-resume: a restored policy continues bit-identically; a reset one does not."""
import threading
from pathlib import Path

import pytest
import torch

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.reference_policies import (ChunkedTransformerPolicy, ChunkedTransformerPolicyConfig,
                                                  GRUPolicy, GRUPolicyConfig)
from flashrt_ros.runtime.arena import BOUNDARY, POSITION
from flashrt_ros.runtime.errors import FingerprintMismatch, InvalidArgument
from flashrt_ros.sim import ReachingTask

POLICIES = {"gru": GRUPolicy, "transformer": ChunkedTransformerPolicy}
K, M, N = 13, 9, 17   # steps before the interrupt, of the other behaviour, after resuming


@pytest.fixture(params=sorted(POLICIES))
def make_engine(request, tmp_path):
    engines = []

    def make(**kwargs):
        engine = PolicyEngine(POLICIES[request.param](), directory=str(tmp_path), **kwargs)
        engines.append(engine)
        return engine

    yield make
    for e in engines:
        e.close()


def _closed_loop(engine: PolicyEngine, task: ReachingTask, n: int) -> list[torch.Tensor]:
    actions = []
    for _ in range(n):
        action = engine.step(task.observation())
        task.step(action)
        actions.append(action)
    return actions


def _other_behaviour(engine: PolicyEngine, task: ReachingTask, n: int, kind: str) -> None:
    """Perturb the engine: a PD expert drives the world and the policy sees its observations, or zeros."""
    for _ in range(n):
        engine.step(task.observation() if kind == "expert" else torch.zeros(engine.policy.obs_dim))
        task.step(task.expert_action())


def _interrupted_run(engine: PolicyEngine, kind: str, resume: str) -> list[torch.Tensor]:
    task = ReachingTask(seed=3)
    _closed_loop(engine, task, K)
    engine.capsules.snapshot("before_interrupt")
    world = task.get_state()
    at_snapshot = engine.arena.block.clone()
    _other_behaviour(engine, task, M, kind)
    assert not torch.equal(engine.arena.block, at_snapshot), "the interruption must perturb the state"
    if resume == "restore":
        engine.capsules.restore("before_interrupt")
        assert torch.equal(engine.arena.block, at_snapshot)
    else:
        engine.capsules.reset()
    task.set_state(world)
    return _closed_loop(engine, task, N)


def _uninterrupted(engine: PolicyEngine) -> list[torch.Tensor]:
    return _closed_loop(engine, ReachingTask(seed=3), K + N)[K:]


@pytest.mark.parametrize("kind", ["expert", "zeros"])
def test_resume_after_restore_is_bit_identical_to_uninterrupted_run(make_engine, kind):
    reference = _uninterrupted(make_engine())
    resumed = _interrupted_run(make_engine(), kind, "restore")
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed, strict=True))


def test_resume_after_plain_reset_diverges(make_engine):
    reference = _uninterrupted(make_engine())
    after_reset = _interrupted_run(make_engine(), "expert", "reset")
    assert not torch.equal(reference[0], after_reset[0])
    assert sum(not torch.equal(a, b) for a, b in zip(reference, after_reset)) >= N // 2


def test_rollback_reproduces_the_bytes_of_earlier_steps(make_engine):
    engine = make_engine(rollback_depth=8)
    task = ReachingTask(seed=1)
    history, worlds, actions = [], [], []
    for _ in range(12):
        history.append(engine.arena.block.clone())
        worlds.append(task.get_state())
        a = engine.step(task.observation())
        task.step(a)
        actions.append(a)
    for back in (1, 3):
        after_step = len(actions) - back                      # rolls back to the state after this step
        engine.capsules.rollback(back)
        assert torch.equal(engine.arena.block, history[after_step])
        task.set_state(worlds[after_step])
        replayed = _closed_loop(engine, task, back)
        assert all(torch.equal(a, b) for a, b in zip(actions[after_step:], replayed, strict=True))
    with pytest.raises(InvalidArgument):
        engine.capsules.rollback(9)


def test_rollback_reaches_the_cold_state_after_reset(make_engine):
    engine = make_engine()
    engine.step(torch.ones(engine.policy.obs_dim))
    engine.capsules.reset()
    cold = engine.arena.block.clone()
    for _ in range(3):
        engine.step(torch.ones(engine.policy.obs_dim))
    engine.capsules.rollback(3)
    assert torch.equal(engine.arena.block, cold)


def test_each_step_is_one_committed_boundary(make_engine):
    engine = make_engine()
    for _ in range(5):
        engine.step(torch.zeros(engine.policy.obs_dim))
    assert int(engine.arena[POSITION]) == 5 == engine.position
    assert int(engine.arena[BOUNDARY]) == 5
    engine.capsules.reset()
    assert engine.position == 0


def test_capsule_saved_to_disk_resumes_in_a_fresh_engine(make_engine):
    first = make_engine()
    task = ReachingTask(seed=4)
    _closed_loop(first, task, K)
    first.capsules.snapshot("episode", tier="host")
    first.capsules.save("episode")
    world = task.get_state()
    expected = _closed_loop(first, task, N)

    second = make_engine()        # same policy class and seed -> same fingerprint, same directory
    second.capsules.load("episode")
    second.capsules.restore("episode")
    task.set_state(world)
    assert all(torch.equal(a, b) for a, b in zip(expected, _closed_loop(second, task, N), strict=True))


def test_capsule_from_other_weights_is_refused(tmp_path):
    a = PolicyEngine(GRUPolicy(), directory=str(tmp_path))
    b = PolicyEngine(GRUPolicy(GRUPolicyConfig(seed=1)), directory=str(tmp_path))
    a.step(torch.ones(6))
    a.capsules.snapshot("x", tier="host")
    a.capsules.save("x")
    with pytest.raises(FingerprintMismatch):
        b.capsules.load("x")


def test_snapshot_from_another_thread_lands_on_a_boundary(make_engine):
    engine = make_engine()
    states = {0: engine.arena.block.clone()}
    go, done = threading.Event(), threading.Event()

    def requester():
        for i in range(5):
            go.wait(timeout=10)
            go.clear()
            engine.capsules.snapshot(f"s{i}")      # races with the engine's next steps
        done.set()

    thread = threading.Thread(target=requester)
    thread.start()
    while not done.is_set() and engine.position < 5000:
        engine.step(torch.sin(torch.arange(engine.policy.obs_dim) + engine.position).float())
        states[engine.position] = engine.arena.block.clone()
        if engine.position % 10 == 0:
            go.set()
    thread.join(timeout=10)
    positions = [engine.store.get(f"s{i}").position for i in range(5)]
    assert positions == sorted(positions) and positions[-1] >= 40
    for i, pos in enumerate(positions):
        engine.capsules.restore(f"s{i}")
        assert torch.equal(engine.arena.block, states[pos]), f"capsule s{i} is not a committed state"


def test_status_reports_latency_and_position(make_engine):
    engine = make_engine()
    for _ in range(20):
        engine.step(torch.zeros(engine.policy.obs_dim))
    status = engine.status()
    lat = status["latency"]
    assert status["position"] == 20 and lat["count"] == 20
    assert 0 < lat["p50_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert status["fingerprint"] == engine.fingerprint


def test_policy_state_names_must_be_prefixed():
    class Bad(GRUPolicy):
        def state_specs(self):
            return [s.__class__(name="hidden", shape=s.shape, dtype=s.dtype) for s in super().state_specs()]

    with pytest.raises(InvalidArgument):
        PolicyEngine(Bad())


def test_stochastic_transformer_policy_noise_is_restored(tmp_path):
    engine = PolicyEngine(ChunkedTransformerPolicy(ChunkedTransformerPolicyConfig(noise_std=1.0)),
                          directory=str(tmp_path))
    obs = torch.ones(6)
    engine.step(obs)
    engine.capsules.snapshot("n")
    first = [engine.step(obs) for _ in range(4)]
    engine.capsules.restore("n")
    again = [engine.step(obs) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def _docs_example_policy():
    """The user policy shown in docs/policies.md, executed as written."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "policies.md").read_text()
    code = text.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/policies.md", "exec"), namespace)
    return namespace["LowPassPD"]()


def test_policy_from_the_docs_plugs_in_and_resumes_exactly(tmp_path):
    ref = PolicyEngine(_docs_example_policy(), directory=str(tmp_path))
    expected = _uninterrupted(ref)
    engine = PolicyEngine(_docs_example_policy(), directory=str(tmp_path))
    resumed = _interrupted_run(engine, "zeros", "restore")
    assert all(torch.equal(a, b) for a, b in zip(expected, resumed, strict=True))
    after_reset = _interrupted_run(PolicyEngine(_docs_example_policy(), directory=str(tmp_path)), "zeros", "reset")
    assert any(not torch.equal(a, b) for a, b in zip(after_reset, expected))


def test_write_state_is_one_boundary_and_a_refused_write_changes_nothing(make_engine):
    engine = make_engine()
    for _ in range(3):
        engine.step(torch.zeros(engine.policy.obs_dim))
    name = next(n for n in engine.arena if n.startswith("policy."))
    before = engine.arena.block.clone()
    boundary = int(engine.arena[BOUNDARY])

    def refuse(arena):
        raise InvalidArgument("bad value")
    with pytest.raises(InvalidArgument, match="bad value"):
        engine.write_state(refuse)
    assert torch.equal(engine.arena.block, before)
    engine.write_state(lambda arena: arena[name].fill_(1))
    assert int(engine.arena[BOUNDARY]) == boundary + 1 and int(engine.arena[POSITION]) == 3
    engine.capsules.rollback(1)
    assert torch.equal(engine.arena.block, before)


def test_redraw_is_refused_for_a_policy_without_a_redraw_context(make_engine):
    engine = make_engine()
    engine.step(torch.zeros(engine.policy.obs_dim))
    with pytest.raises(InvalidArgument, match="cannot redraw"):
        engine.redraw(1)
