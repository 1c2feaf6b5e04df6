"""On CUDA, a policy step captured once as a CUDA graph survives capsule restore (needs a GPU)."""
import pytest
import torch

from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.models.reference_policies import ChunkedTransformerPolicy, GRUPolicy
from flashrt_ros.sim import ReachingTask

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (hardware, not a failure)")
POLICIES = {"gru": GRUPolicy, "transformer": ChunkedTransformerPolicy}


def _loop(engine: PolicyEngine, task: ReachingTask, n: int) -> list[torch.Tensor]:
    out = []
    for _ in range(n):
        a = engine.step(task.observation()).cpu()
        task.step(a)
        out.append(a)
    return out


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_graph_replay_matches_eager_on_the_same_device(name, tmp_path):
    eager = PolicyEngine(POLICIES[name](), device="cuda", directory=str(tmp_path))
    graph = PolicyEngine(POLICIES[name](), device="cuda", cuda_graph=True, directory=str(tmp_path))
    assert graph.status()["cuda_graph"] and graph.position == 0
    a = _loop(eager, ReachingTask(seed=2), 30)
    b = _loop(graph, ReachingTask(seed=2), 30)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_restore_under_a_captured_graph_resumes_bit_identically(name, tmp_path):
    ref = PolicyEngine(POLICIES[name](), device="cuda", cuda_graph=True, directory=str(tmp_path))
    expected = _loop(ref, ReachingTask(seed=5), 40)[20:]

    engine = PolicyEngine(POLICIES[name](), device="cuda", cuda_graph=True, directory=str(tmp_path))
    ptrs = {n: engine.arena[n].data_ptr() for n in engine.arena}
    task = ReachingTask(seed=5)
    _loop(engine, task, 20)
    engine.capsules.snapshot("k")
    world = task.get_state()
    for _ in range(7):
        engine.step(torch.zeros(6))
    engine.capsules.restore("k")
    task.set_state(world)
    resumed = _loop(engine, task, 20)
    assert {n: engine.arena[n].data_ptr() for n in engine.arena} == ptrs
    assert all(torch.equal(x, y) for x, y in zip(expected, resumed, strict=True))
    engine.capsules.rollback(3)
    assert engine.position == 37
