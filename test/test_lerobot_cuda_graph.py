"""On CUDA, a whole ACT / Diffusion step is one captured graph that matches the eager step (needs a GPU)."""
import pytest
import torch

from tiny_lerobot_policies import episode_observations, tiny_act, tiny_diffusion
from flashrt_ros.engine.policy_engine import PolicyEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (hardware, not a failure)")
POLICIES = {
    "act_queue": lambda: tiny_act(),
    "act_temporal_ensemble": lambda: tiny_act(ensemble=True),
    "diffusion_ddim": lambda: tiny_diffusion(scheduler="DDIM"),
    "diffusion_ddpm": lambda: tiny_diffusion(scheduler="DDPM"),
}


@pytest.fixture
def no_tf32():
    """Full fp32 on the GPU for the comparison with the CPU (cuDNN convolutions default to TF32)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_captured_step_matches_eager_and_cpu_and_survives_restore(name, tmp_path, no_tf32):
    make = POLICIES[name]
    cpu = PolicyEngine(make(), directory=str(tmp_path / "cpu"))
    eager = PolicyEngine(make(), device="cuda", directory=str(tmp_path / "eager"))
    graph = PolicyEngine(make(), device="cuda", cuda_graph=True, directory=str(tmp_path / "graph"))
    assert graph.status()["cuda_graph"]
    obs = episode_observations(cpu.policy, 20, seed=1)
    a_cpu = torch.stack([cpu.step(o) for o in obs])
    a_eager = torch.stack([eager.step(o) for o in obs])
    a_graph = []
    for i, o in enumerate(obs):
        if i == 6:
            graph.capsules.snapshot("mid")
        a_graph.append(graph.step(o))
    a_graph = torch.stack(a_graph)
    torch.testing.assert_close(a_graph, a_eager, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a_graph.cpu(), a_cpu, rtol=1e-3, atol=1e-3)
    graph.capsules.restore("mid")
    again = torch.stack([graph.step(o) for o in obs[6:]])
    assert torch.equal(again, a_graph[6:])
