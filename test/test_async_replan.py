"""Planning beside the control loop (``replan: async``): the timing model, exact capsules with a chunk in
flight, nothing planned before a reset or a halt reaching the robot, blending, holding when late.

CPU, tiny ACT (weight seed 1: seed 0's outputs hardly depend on the observation) and Diffusion
policies with seeded weights. The schedule is in control steps, so
with ``late="wait"`` every run below is exact whatever the machine's speed (a virtual clock:
the step that is due to merge waits for the plan).
"""
from __future__ import annotations

import threading

import pytest
import torch

from flashrt_ros.engine.chunk_planner import ACTIVE, COPY, READY, ReplanConfig
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.runtime.errors import InvalidArgument
from tiny_lerobot_policies import episode_observations, tiny_act, tiny_diffusion
from waiting import wait_until


def engine(policy, tmp_path, **replan) -> PolicyEngine:
    cfg = ReplanConfig(**{"mode": "async", "late": "wait", **replan})
    return PolicyEngine(policy, directory=str(tmp_path / "capsules"), replan=cfg)


def run(e: PolicyEngine, obs: list) -> list[torch.Tensor]:
    return [e.step(o) for o in obs]


def test_actions_follow_the_timing_model(tmp_path):
    """ACT, chunk 8 with 5 queued, delay 2: the first chunk is planned in step 0; a plan launches at the end
    of a step that leaves 2 queued (steps 2, 6, 10) from that step's observation, and two steps later
    the queue holds its actions 2..6 (the chunk's 6th and 7th are predicted beyond the 5 it queues):
    steps 4-7 run chunk(obs 2)[2..5], steps 8-11 chunk(obs 6)[2..5], a plan every 5 - 1 steps."""
    policy = tiny_act(seed=1)
    obs = episode_observations(policy, 14, seed=3)
    e = engine(policy, tmp_path, delay_steps=2)
    actions = run(e, obs)
    with torch.no_grad():
        chunks = [policy.norm.action(policy.predict_chunk(o).float()) for o in obs]
    expected = [chunks[0][t] for t in range(4)] + [chunks[4 * ((t - 4) // 4) + 2][2 + (t - 4) % 4]
                                                   for t in range(4, 14)]
    assert (chunks[2][2] - chunks[0][4]).abs().max() > 1e-3, "the policy's chunks differ (a test that can fail)"
    assert all(torch.equal(a, b) for a, b in zip(actions, expected))
    counts = e.replan_status()
    assert counts["launched"] == 3 and counts["merged"] == 3 and counts["held"] == 0


def test_a_merge_late_by_more_than_the_lookahead_queues_what_is_left(tmp_path):
    """Delay 5 with 5 queued of a chunk of 8: merged at its action 5, the chunk has 3 actions left (5..7)."""
    policy = tiny_act(seed=1)
    obs = episode_observations(policy, 10, seed=3)
    e = engine(policy, tmp_path, delay_steps=5)
    actions = run(e, obs[:8])
    with torch.no_grad():
        chunk0 = policy.norm.action(policy.predict_chunk(obs[0]).float())
    # after step 0 four are left (<= 5): launched from obs 0, due at step 0 + min(5, 5) = 5, at its action 5
    assert all(torch.equal(actions[t], chunk0[t]) for t in range(8))
    assert e.replan_status()["merged"] == 1 and e.schedule.left.get() == 0


def test_a_delay_longer_than_a_merged_chunk_lasts_is_reported(tmp_path):
    """Chunk 8 with 5 queued (3 to spare): at delay 2 a merged chunk lasts 5 steps, at delay 5 only 3,
    less than the next plan takes; every such launch is counted and the status says how long a chunk
    lasts (the node's /diagnostics warns from it)."""
    from flashrt_ros.ros.diagnostics import delay_over_chunk
    policy = tiny_act(seed=1)
    obs = episode_observations(policy, 14, seed=3)
    short, long_ = engine(policy, tmp_path / "a", delay_steps=2), engine(policy, tmp_path / "b", delay_steps=5)
    run(short, obs)
    run(long_, obs)
    ok, bad = short.replan_status(), long_.replan_status()
    assert (ok["chunk_steps"], ok["delay_over_chunk"]) == (5, 0) and not delay_over_chunk(ok)
    assert bad["chunk_steps"] == 3 and bad["launched"] >= 2
    assert bad["delay_over_chunk"] == bad["launched"]
    assert "delay 5 steps > the 3 a merged chunk lasts" in delay_over_chunk(bad)


def test_the_control_thread_never_runs_the_network_after_the_first_chunk(tmp_path, monkeypatch):
    policy = tiny_act(seed=1)
    threads: list[str] = []
    predict = policy.predict_chunk
    monkeypatch.setattr(policy, "predict_chunk", lambda o: (threads.append(threading.current_thread().name),
                                                           predict(o))[1])
    e = engine(policy, tmp_path, delay_steps=2)
    run(e, episode_observations(policy, 20, seed=1))
    assert threads[0] == "MainThread" and threads[1:] and set(threads[1:]) == {"flashrt-planner"}


@pytest.mark.parametrize("make", [tiny_act, tiny_diffusion], ids=["act", "diffusion"])
def test_a_capsule_taken_with_a_chunk_in_flight_continues_bit_identically(tmp_path, make):
    policy = make()
    obs = episode_observations(policy, 30, seed=4)
    e = engine(policy, tmp_path, delay_steps=3)
    run(e, obs[:7])
    launched = e.replan_status()["launched"]
    assert int(e.arena[ACTIVE]) == 1, "a plan is in flight at the snapshot"
    e.capsules.snapshot("mid")
    assert int(e.arena[READY]) == 1, "the snapshot waited for the plan and holds its result"
    first = run(e, obs[7:])
    e.capsules.restore("mid")
    again = run(e, obs[7:])
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert e.replan_status()["launched"] > launched + 1


def test_nothing_planned_before_a_reset_or_a_halt_is_merged_after_it(tmp_path):
    policy = tiny_act(seed=1)
    obs = episode_observations(policy, 16, seed=6)
    fresh = run(engine(policy, tmp_path / "fresh", delay_steps=3), obs)
    e = engine(policy, tmp_path / "reset", delay_steps=3)
    run(e, episode_observations(policy, 3, seed=9))                  # a plan launches at step 2
    assert int(e.arena[ACTIVE]) == 1
    e.capsules.reset()
    assert all(torch.equal(a, b) for a, b in zip(run(e, obs), fresh)), "after a reset: a new episode"
    h = engine(policy, tmp_path / "halt", delay_steps=3)
    run(h, obs[:3])
    assert h.drop_pending() and int(h.arena[ACTIVE]) == 0
    after = run(h, obs[3:5])
    with torch.no_grad():
        chunk0 = policy.norm.action(policy.predict_chunk(obs[0])[:5].float())
    assert torch.equal(after[0], chunk0[3]) and torch.equal(after[1], chunk0[4]), "the old queue runs on"
    assert h.replan_status()["merged"] == 0 and h.replan_status()["dropped"] == 1


def test_blending_mixes_the_old_chunk_into_the_new(tmp_path):
    """Delay 1, blend 2: the queue runs down to 1 at step 3, a plan from obs 3 merges at step 4 at its
    action 1; the old chunk has one action left there (its action 4), so that one is blended (w = 1/3)."""
    policy = tiny_act(seed=1)
    obs = episode_observations(policy, 8, seed=2)
    actions = run(engine(policy, tmp_path, delay_steps=1, blend_steps=2), obs)
    with torch.no_grad():
        old, new = policy.predict_chunk(obs[0])[:5].float(), policy.predict_chunk(obs[3])[:5].float()
    w = torch.tensor(1 / 3)
    assert torch.equal(actions[4], policy.norm.action((1 - w) * old[4] + w * new[1])), "the same arithmetic"
    assert not torch.allclose(actions[4], policy.norm.action(new[1]), rtol=0, atol=1e-4), "blended, not replaced"
    assert torch.equal(actions[5], policy.norm.action(new[2])), "past the old chunk's end: the new chunk"


def test_a_late_plan_lets_the_old_queue_run_then_holds_and_merges_where_the_robot_is(tmp_path, monkeypatch):
    """``late: hold``, 5 queued actions, delay 1: the plan launched after step 3 (obs 3) is due at step 4 and
    not done. Step 4 runs the old chunk's last action, step 5 holds it (counted), and once the plan is
    done the next step runs its action 2: the robot ran steps 3 and 4 since its observation, the held
    step does not count."""
    policy = tiny_act(seed=1)
    release = threading.Event()
    predict = policy.predict_chunk

    def slow(o):
        if threading.current_thread().name == "flashrt-planner":
            release.wait(30)
        return predict(o)
    monkeypatch.setattr(policy, "predict_chunk", slow)
    e = engine(policy, tmp_path, delay_steps=1, late="hold")
    obs = episode_observations(policy, 8, seed=5)
    actions = run(e, obs[:7])
    with torch.no_grad():
        old, new = (policy.norm.action(predict(o)[:5].float()) for o in (obs[0], obs[3]))
    assert torch.equal(actions[4], old[4]), "late: the old queue runs on"
    assert torch.equal(actions[5], actions[4]) and torch.equal(actions[6], actions[4]), "then dry: held"
    status = e.replan_status()
    assert status["late"] == 1 and status["held"] == 2 and status["merged"] == 0
    release.set()
    wait_until(e.schedule.planner.done, 60, "the released plan to finish")
    assert torch.equal(e.step(obs[7]), new[2])
    assert e.replan_status()["merged"] == 1


def test_a_dry_queue_with_nothing_coming_holds_and_plans_beside_the_loop(tmp_path, monkeypatch):
    """A halt drops a late plan as the old queue runs out: the next step finds the queue dry and nothing
    coming, holds the last command and launches a plan from its observation; held steps do not move the
    robot, so the plan merges at its action 0."""
    policy = tiny_act(seed=1)
    release = threading.Event()
    predict = policy.predict_chunk

    def slow(o):
        if threading.current_thread().name == "flashrt-planner":
            release.wait(30)
        return predict(o)
    monkeypatch.setattr(policy, "predict_chunk", slow)
    e = engine(policy, tmp_path, delay_steps=1, late="hold")
    obs = episode_observations(policy, 40, seed=7)
    actions = run(e, obs[:5])              # launched after step 3, late at step 4: the old queue's last action
    assert e.drop_pending() and e.schedule.left.get() == 0
    release.set()
    actions.append(e.step(obs[5]))         # dry, nothing coming: hold, plan from obs 5
    assert torch.equal(actions[5], actions[4]) and e.replan_status()["launched"] == 2
    wait_until(e.schedule.planner.done, 60, "the released plan to finish")
    actions.append(e.step(obs[6]))
    with torch.no_grad():
        fresh = policy.norm.action(predict(obs[5])[:5].float())
    assert torch.equal(actions[-1], fresh[0]), "merged at action 0"


def test_a_rollback_to_a_plan_still_in_flight_plans_again(tmp_path):
    policy = tiny_act(seed=1)
    obs = episode_observations(policy, 12, seed=8)
    e = engine(policy, tmp_path, delay_steps=2)
    run(e, obs[:4])                         # launched at the end of step 2, due at step 4
    e.capsules.rollback(1)                  # back to just after step 2: the plan is in the state, not its result
    assert int(e.arena[ACTIVE]) == 1 and int(e.arena[READY]) == 0
    run(e, obs[3:])
    status = e.replan_status()
    assert status["dropped"] >= 1 and status["merged"] >= 1


def test_async_is_refused_for_a_policy_that_cannot_plan_beside_the_loop(tmp_path):
    with pytest.raises(InvalidArgument, match="replan must be sync"):
        engine(tiny_act(ensemble=True), tmp_path)
    with pytest.raises(InvalidArgument, match="replan must be one of"):
        PolicyEngine(tiny_act(seed=1), replan=ReplanConfig(mode="sometimes"))
    with pytest.raises(InvalidArgument, match="takes no Real-Time Chunking guidance.*replan async"):
        engine(tiny_diffusion(), tmp_path, mode="rtc")


def test_the_pending_plan_is_part_of_the_capsule(tmp_path):
    policy = tiny_diffusion()
    e = engine(policy, tmp_path, delay_steps=2)
    run(e, episode_observations(policy, 3, seed=1))
    e.capsules.snapshot("with_plan")
    names = set(e.arena.names) if hasattr(e.arena, "names") else {s.name for s in e.arena.specs}
    assert {COPY + policy.QUEUE, COPY + policy.PLANS, ACTIVE, READY} <= names


def test_a_new_instruction_or_a_redraw_drops_the_plan_in_flight(tmp_path):
    """A plan launched before an instruction change (or a redraw refilling the queue) was planned from the
    state before it: it is dropped, and the chunk merged next is planned with the new instruction."""
    from flashrt_ros.engine.vla import set_instruction_ids
    from test_smolvla_capsules import INSTRUCTION, observation, tiny_policy
    obs = [observation(i) for i in range(12)]
    e = engine(tiny_policy(), tmp_path / "a", delay_steps=2)
    set_instruction_ids(e, INSTRUCTION)
    run(e, obs[:3])                         # 5 queued: a plan launches after step 2
    assert int(e.arena[ACTIVE]) == 1
    set_instruction_ids(e, INSTRUCTION[:-2])
    assert int(e.arena[ACTIVE]) == 0 and e.replan_status()["dropped"] == 1
    after = run(e, obs[3:])
    fresh = engine(tiny_policy(), tmp_path / "b", delay_steps=2)
    set_instruction_ids(fresh, INSTRUCTION)
    run(fresh, obs[:3])
    fresh.drop_pending()                    # the same schedule, the new instruction from step 3 on
    set_instruction_ids(fresh, INSTRUCTION[:-2])
    assert all(torch.equal(a, b) for a, b in zip(after, run(fresh, obs[3:])))
    for i in range(12):                     # until a plan is in flight again
        if int(e.arena[ACTIVE]):
            break
        e.step(observation(20 + i))
    assert int(e.arena[ACTIVE]) == 1
    e.redraw(5)
    assert int(e.arena[ACTIVE]) == 0 and e.replan_status()["dropped"] == 2
