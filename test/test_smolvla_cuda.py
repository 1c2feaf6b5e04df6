"""SmolVLA on CUDA: the engine's replan, pop and redraw graphs over the arena in both numerics; the fast numerics
(triton row kernels, memory-efficient SDPA, captured) against the exact ones; parity with LeRobot at the published
size in both numerics.

GPU only (each test skips on a machine without CUDA, saying so).
"""
from __future__ import annotations

import pytest
import torch

from test_smolvla_capsules import INSTRUCTION, observation, tiny_policy
from test_smolvla_fast import LAYOUTS, tiny_smolvla
from test_smolvla_fast import observation as two_camera_observation
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction, set_instruction_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graph capture)")


def cuda_obs(i: int, observe=observation) -> dict:
    return {k: v.cuda() for k, v in observe(i).items()}


@pytest.fixture
def no_tf32():
    """float32 products in float32 for the test (TF32 rounds them to 10 bits), restored after it."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def policy_in(numerics: str):
    policy = tiny_policy()
    policy.use_numerics(numerics)
    return policy


@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_captured_replan_pop_and_redraw_replay_eager_and_restore_bit_identically(numerics, tmp_path):
    eager = PolicyEngine(policy_in(numerics), device="cuda", directory=str(tmp_path / "e"))
    graph = PolicyEngine(policy_in(numerics), device="cuda", cuda_graph=True, directory=str(tmp_path / "g"))
    for e in (eager, graph):
        set_instruction_ids(e, INSTRUCTION)
    assert graph.status()["cuda_graph"] and not eager.status()["cuda_graph"]   # replan, pop and redraw graphs
    ref = torch.stack([eager.step(cuda_obs(i)) for i in range(17)])
    replans, first = [], []
    for i in range(7):
        replans.append(graph.next_step_replans())          # the host's choice: replan graph or pop graph
        first.append(graph.step(cuda_obs(i)))
    first = torch.stack(first)
    graph.capsules.snapshot("mid")
    for i in range(9):
        graph.step(cuda_obs(50 + i))
    graph.capsules.restore("mid")
    rest = torch.stack([graph.step(cuda_obs(i)) for i in range(7, 17)])
    ours = torch.cat([first, rest])
    assert replans == [i % 5 == 0 for i in range(7)]
    assert (ours - ref).abs().max() <= 1e-5 * ref.abs().max()
    # the restored graph run replays the uninterrupted graph run exactly
    graph.capsules.restore("mid")
    again = torch.stack([graph.step(cuda_obs(i)) for i in range(7, 17)])
    assert torch.equal(again, rest)
    # a fork's noise draw through the captured denoising loop
    graph.redraw(3)
    eager.redraw(3)
    q = graph.policy.QUEUE
    assert (graph.arena[q] - eager.arena[q]).abs().max() <= 1e-5 * eager.arena[q].abs().max()


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fast_graphs_match_exact_eager(layout, dtype, tolerance, tmp_path, no_tf32):
    """The fast numerics (fused kernels, captured) against the exact ones (eager) over three chunks, two cameras:
    the same function within rounding (float32: TF32 off, every prefix KV layer; bf16: two bf16 computations,
    the first two layers' KV rows, whose rounding the later layers' amplify)."""
    engines = {}
    for numerics, graphs in (("exact", False), ("fast", True)):
        engines[numerics] = PolicyEngine(tiny_smolvla(dtype, numerics, **LAYOUTS[layout]), device="cuda",
                                         cuda_graph=graphs, directory=str(tmp_path / numerics))
        set_instruction_ids(engines[numerics], INSTRUCTION)
    exact, fast = engines["exact"], engines["fast"]
    assert fast.status()["cuda_graph"]
    ref = torch.stack([exact.step(cuda_obs(i, two_camera_observation)) for i in range(15)])
    ours = torch.stack([fast.step(cuda_obs(i, two_camera_observation)) for i in range(15)])
    err = float((ours - ref).abs().max() / ref.abs().max())
    print(f"{layout} {dtype} fast vs exact: {err:.2e}")
    assert err <= tolerance
    p = exact.policy
    valid = int(exact.arena[p.PREFIX_LEN])
    assert int(fast.arena[p.PREFIX_LEN]) == valid
    for i in range(p.cfg.num_vlm_layers if dtype == torch.float32 else 2):
        for name in (f"{p.KEY}{i}", f"{p.VALUE}{i}"):
            a, b = fast.arena[name].float(), exact.arena[name].float()
            assert float((a - b).abs().max() / b.abs().max()) <= tolerance, name
            assert (a[valid:] == 0).all(), name


def test_published_size_matches_lerobot_on_the_gpu_over_two_chunks(tmp_path):
    from lerobot_reference import case_features, max_relative_error, observations, processors
    from smolvla_reference import PUBLISHED, make_smolvla_checkpoint, write_vlm_directory
    from test_lerobot_smolvla import plan_noise

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    vlm = write_vlm_directory(tmp_path / "vlm", PUBLISHED, allow_standin=True)
    case = dict(cameras=2, hw=(256, 256), state=6, env=0, action=6, norm="MEAN_STD", cfg={})
    real = dict(num_vlm_layers=16, chunk_size=50, n_action_steps=50, num_steps=10, max_state_dim=32,
                max_action_dim=32, resize_imgs_with_padding=(512, 512), tokenizer_max_length=48)
    directory, ref, config = make_smolvla_checkpoint(tmp_path / "ckpt", case, vlm, **real)
    obs = observations(case_features(case), 100, seed=4)
    pre, post = processors(config, directory)
    ref = ref.cuda()
    ref.reset()
    expected = []
    with torch.no_grad():
        for i, o in enumerate(obs):
            batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in pre({**o, "task": "stack"}).items()}
            noise = plan_noise(0, i // config.n_action_steps, config).cuda()
            expected.append(post(ref.select_action(batch, noise=noise).cpu())[0])
    expected = torch.stack(expected)
    from benchmarks.race import TOLERANCE
    from flashrt_ros.models.policy_factory import make_policy
    # fp32 (TF32 off) within 1e-3 of the largest action, both numerics; bf16 fast within the race's bf16 tolerance
    for numerics, dtype, bound in (("exact", torch.float32, 1e-3), ("fast", torch.float32, 1e-3),
                                   ("fast", torch.bfloat16, TOLERANCE["bf16"])):
        engine = PolicyEngine(make_policy(f"lerobot:{directory}", dtype, numerics), device="cuda", cuda_graph=True,
                              directory=str(tmp_path / f"caps_{numerics}_{dtype}"))
        set_instruction(engine, "stack")
        ours = torch.stack([engine.step({k: v.cuda() for k, v in o.items()}).cpu() for o in obs])
        err = max_relative_error(ours, expected)
        print(f"published size, ours {numerics} {dtype} vs LeRobot fp32 on the GPU: max relative error {err:.2e} "
              f"over 100 steps (2 chunks), bound {bound:.0e}")
        assert err <= bound, (numerics, dtype)
        engine.close()
        del engine
        torch.cuda.empty_cache()
