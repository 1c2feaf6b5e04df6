"""The simulated reaching task is deterministic, replayable from its state, and solvable."""
import numpy as np
import torch

from flashrt_ros.sim import ReachingTask


def _rollout(task: ReachingTask, n: int) -> list[torch.Tensor]:
    obs = []
    for i in range(n):
        o, _, _ = task.step(torch.tensor([np.sin(i), np.cos(0.5 * i)]))
        obs.append(o)
    return obs


def test_same_seed_same_trajectory():
    a, b = ReachingTask(seed=5), ReachingTask(seed=5)
    assert torch.equal(a.observation(), b.observation())
    assert all(torch.equal(x, y) for x, y in zip(_rollout(a, 50), _rollout(b, 50)))
    assert not torch.equal(ReachingTask(seed=6).observation(), ReachingTask(seed=5).observation())


def test_set_state_replays_exactly():
    task = ReachingTask(seed=2)
    _rollout(task, 10)
    saved = task.get_state()
    first = _rollout(task, 30)
    task.set_state(saved)
    assert all(torch.equal(x, y) for x, y in zip(first, _rollout(task, 30)))


def test_pd_expert_reaches_the_target():
    task = ReachingTask(seed=0)
    done, reward = False, 0.0
    while not done:
        _, reward, done = task.step(task.expert_action())
    assert task.steps < task.cfg.max_steps
    assert -reward < task.cfg.success_radius + 0.01


def test_force_is_clipped():
    a, b = ReachingTask(seed=1), ReachingTask(seed=1)
    oa, _, _ = a.step(torch.tensor([50.0, -50.0]))
    ob, _, _ = b.step(torch.tensor([a.cfg.max_force, -a.cfg.max_force]))
    assert torch.equal(oa, ob)
