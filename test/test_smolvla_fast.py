"""SmolVLA in the ``fast`` numerics on the CPU (tiny sizes): the same function as ``exact``, the same state.

What a plan computes with is free, what it touches is not: ``fast`` (SigLIP with the cameras batched, fused
projections with folded norms, the prefix computed in the arena's row order, grouped-query SDPA, the expert's
cross-attention keys once per plan, the row kernels' torch references) must give ``exact``'s actions and prefix
KV rows within float32 rounding, and keep every capsule property ``exact`` has: mid-chunk restore, a plan in
flight, what a plan writes, no host read in a body, redraw. Parity with LeRobot itself under ``fast`` is in
``test_lerobot_smolvla.py``; the triton kernels are ``test_fused_rows.py``; on a GPU, ``test_smolvla_cuda.py``.
"""
from __future__ import annotations

import pytest
import torch

from host_reads import no_host_reads
from test_smolvla_capsules import INSTRUCTION, TINY_VLM
from flashrt_ros.engine.chunk_planner import ACTIVE, ReplanConfig
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import set_instruction_ids
from flashrt_ros.models.lerobot import cast_networks
from flashrt_ros.models.lerobot.smolvla.configuration_smolvla import SmolVLAConfig
from flashrt_ros.models.lerobot.smolvla.modeling_smolvla import SmolVLAPolicy
from flashrt_ros.models.policy_interface import Guidance
from flashrt_ros.models.rtc import prefix_weights
from flashrt_ros.runtime.errors import FingerprintMismatch, InvalidArgument

CAMERAS = ("observation.images.top", "observation.images.wrist")
#: two cameras, self- and cross-attention layers alternating (the published layout); an expert on every other
#: VLM layer; self-attention everywhere
LAYOUTS = {"cross_attn": {}, "half_expert": dict(num_expert_layers=2, self_attn_every_n_layers=4),
           "self_attn": dict(attention_mode="self_attn")}


def tiny_smolvla(dtype: torch.dtype = torch.float32, numerics: str = "fast", seed: int = 0,
                 **overrides) -> SmolVLAPolicy:
    """Our SmolVLA at CI size with seeded random weights, cast as a checkpoint is, in ``numerics``."""
    args = dict(state_dim=4, env_state_dim=0, action_dim=3, cameras=CAMERAS, image_shape=(3, 24, 40), vlm=TINY_VLM,
                chunk_size=6, n_action_steps=5, max_state_dim=8, max_action_dim=8, resize_imgs_with_padding=(32, 32),
                tokenizer_max_length=8, num_vlm_layers=4)
    args.update(overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = SmolVLAPolicy(SmolVLAConfig(**args))
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.2 * torch.randn_like(p))
    policy = cast_networks(policy, dtype).eval().requires_grad_(False)
    policy.use_numerics(numerics)
    return policy


def observation(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + i)
    return {"observation.state": torch.randn(4, generator=g),
            **{cam: torch.rand(3, 24, 40, generator=g) for cam in CAMERAS}}


def make_engine(tmp_path, numerics: str = "fast", name: str = "e", replan: str = "sync",
                dtype: torch.dtype = torch.float32, instruction: list[int] = INSTRUCTION, **overrides) -> PolicyEngine:
    cfg = ReplanConfig(mode=replan, delay_steps=2, late="wait", rtc_horizon=4)
    engine = PolicyEngine(tiny_smolvla(dtype, numerics, **overrides), directory=str(tmp_path / name),
                          rollback_depth=4, replan=cfg)
    set_instruction_ids(engine, instruction)
    return engine


def run(engine: PolicyEngine, start: int, n: int) -> torch.Tensor:
    return torch.stack([engine.step(observation(start + i)) for i in range(n)])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fast_equals_exact_within_rounding(layout, dtype, tolerance, tmp_path):
    """Three chunks and their pops, and every layer's prefix KV rows (valid first, zeros after)."""
    exact = make_engine(tmp_path, "exact", "x", dtype=dtype, **LAYOUTS[layout])
    fast = make_engine(tmp_path, "fast", "f", dtype=dtype, **LAYOUTS[layout])
    assert rel(run(fast, 0, 15), run(exact, 0, 15)) <= tolerance
    p = exact.policy
    valid = int(exact.arena[p.PREFIX_LEN])
    assert int(fast.arena[p.PREFIX_LEN]) == valid == 2 * TINY_VLM.image_tokens + len(INSTRUCTION) + 1
    for i in range(p.cfg.num_vlm_layers):
        for name in (p.KEY, p.VALUE):
            assert rel(fast.arena[f"{name}{i}"], exact.arena[f"{name}{i}"]) <= tolerance, (name, i)
            assert (fast.arena[f"{name}{i}"][valid:] == 0).all()


@pytest.mark.parametrize("instruction", [[], list(range(1, 9))], ids=["empty", "full"])
def test_fast_prefix_order_holds_for_an_empty_and_a_full_instruction(instruction, tmp_path):
    """The state token's row moves with the instruction's length: none, or no padding after it."""
    exact = make_engine(tmp_path, "exact", "x", instruction=instruction)
    fast = make_engine(tmp_path, "fast", "f", instruction=instruction)
    assert rel(run(fast, 0, 6), run(exact, 0, 6)) <= 1e-5
    p = exact.policy
    for name in (p.KEY + "0", p.VALUE + "3"):
        assert rel(fast.arena[name], exact.arena[name]) <= 1e-5
    assert torch.equal(fast.arena[p.PREFIX_LEN], exact.arena[p.PREFIX_LEN])


def test_rtc_guided_fast_plan_equals_exact_within_rounding():
    cfg = tiny_smolvla().cfg
    guide = Guidance(torch.randn(cfg.n_action_steps, cfg.action_dim, generator=torch.Generator().manual_seed(1)),
                     torch.tensor(3), prefix_weights(2, 4, cfg.chunk_size, "linear"))
    queues = {}
    for numerics in ("exact", "fast"):
        engine = PolicyEngine(tiny_smolvla(numerics=numerics))
        set_instruction_ids(engine, INSTRUCTION)
        with torch.no_grad():
            engine.policy.plan(observation(0), engine.arena, guide)
        queues[numerics] = engine.arena[engine.policy.QUEUE].clone()
    assert rel(queues["fast"], queues["exact"]) <= 1e-5


def test_fast_snapshot_mid_chunk_other_work_restore_is_bit_identical(tmp_path):
    uninterrupted = run(make_engine(tmp_path, name="ref"), 0, 17)
    engine = make_engine(tmp_path)
    first = run(engine, 0, 7)
    engine.capsules.snapshot("mid")
    set_instruction_ids(engine, [1, 2])
    run(engine, 50, 9)
    engine.capsules.reset(seed=7)
    run(engine, 80, 3)
    engine.capsules.restore("mid")
    assert torch.equal(torch.cat([first, run(engine, 7, 10)]), uninterrupted)


@pytest.mark.parametrize("mode", ["async", "rtc"])
def test_fast_capsule_with_a_plan_in_flight_continues_bit_identically(mode, tmp_path):
    engine = make_engine(tmp_path, replan=mode)
    run(engine, 0, 4)
    assert int(engine.arena[ACTIVE]) == 1, "a plan is in flight at the snapshot"
    engine.capsules.snapshot("in_flight")
    once = run(engine, 4, 12)
    engine.capsules.restore("in_flight")
    assert torch.equal(once, run(engine, 4, 12))
    engine.close()


def test_a_fast_plan_writes_exactly_the_buffers_its_action_queue_names(tmp_path):
    engine = make_engine(tmp_path)
    p, arena, queue = engine.policy, engine.arena, engine.policy.action_queue()
    run(engine, 0, 2)
    set_instruction_ids(engine, [9, 10])
    before = {name: arena[name].clone() for name in arena}
    ahead = torch.zeros(queue.ahead, p.cfg.action_dim)
    with torch.no_grad():
        p.plan(observation(3), arena, None, ahead)
    assert {name for name in arena if not torch.equal(arena[name], before[name])} == \
        {queue.chunk, queue.left, *queue.planned}


def test_fast_bodies_read_nothing_on_the_host(tmp_path, monkeypatch):
    engine = make_engine(tmp_path)
    p, arena = engine.policy, engine.arena
    cfg = p.cfg
    obs = observation(0)
    guide = Guidance(torch.randn(cfg.n_action_steps, cfg.action_dim), torch.tensor(3),
                     prefix_weights(2, 3, cfg.chunk_size, "linear"))
    with no_host_reads(monkeypatch):
        p.step_observation(obs, arena, replan=True)
        p.step_observation(obs, arena, replan=False)
        p.redraw_chunk(arena)
        p.plan(obs, arena, guide)
    assert int(arena[p.LEFT]) == cfg.n_action_steps


def test_fast_redraw_is_the_first_chunk_of_that_seed_over_the_stored_prefix(tmp_path):
    reference = make_engine(tmp_path, name="ref")
    reference.capsules.reset(seed=4)
    expected = run(reference, 0, 5)                         # one chunk planned over observation 0
    engine = make_engine(tmp_path)
    engine.capsules.reset(seed=9)
    run(engine, 0, 2)
    engine.redraw(4)
    assert torch.equal(run(engine, 50, 5), expected)        # pops: the observation is not read


def test_a_capsule_of_one_numerics_is_refused_by_the_other(tmp_path):
    """The numerics are part of the fingerprint; a policy's numerics are chosen once."""
    exact = make_engine(tmp_path, "exact", "shared")
    run(exact, 0, 3)
    exact.capsules.snapshot("home")
    exact.capsules.save("home")
    fast = make_engine(tmp_path, "fast", "shared")
    assert exact.fingerprint != fast.fingerprint
    assert exact.policy.config()["numerics"] == "exact" and fast.policy.config()["numerics"] == "fast"
    with pytest.raises(FingerprintMismatch):
        fast.capsules.load("home")
    with pytest.raises(InvalidArgument, match="choose it once"):
        fast.policy.use_numerics("exact")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fast_plan_through_its_few_row_kernels_equals_exact(layout, tmp_path, monkeypatch):
    """The kernels a GPU runs for the expert's chunk rows, in the plan, on the CPU: triton's interpreter takes every
    few-row product (q / k / v with the folded norm and RoPE, the SiLU-gated gate / up, the output and down
    products with their residuals) and the episode must give ``exact``'s actions within float32 rounding."""
    from triton_interpret import INTERPRET, needs_triton
    if needs_triton.args[0] or not INTERPRET:
        pytest.skip("needs triton's interpreter (a GPU runs the same kernels in test_smolvla_cuda.py)")
    import dataclasses
    from flashrt_ros.ops import fused_rows, rows_matmul
    from flashrt_ros.ops.triton import rows_matmul as kernels
    vlm = dataclasses.replace(TINY_VLM, head_dim=32)        # the few-row RoPE kernel's smallest head
    exact = make_engine(tmp_path, "exact", "x", vlm=vlm, **LAYOUTS[layout])
    fast = make_engine(tmp_path, "fast", "f", vlm=vlm, **LAYOUTS[layout])
    launched = {"store": 0, "residual": 0, "silu_gate": 0, "qkv_rope": 0}
    launch = kernels._launch

    def counted(grid, x, w, scale, epilogue, *args, **kwargs):
        launched[epilogue] += 1
        return launch(grid, x, w, scale, epilogue, *args, **kwargs)
    monkeypatch.setattr(fused_rows, "use_triton", lambda x: True)
    monkeypatch.setattr(rows_matmul, "use_triton", lambda x: True)
    monkeypatch.setattr(kernels, "_launch", counted)
    out = run(fast, 0, 7)
    monkeypatch.undo()
    assert launched["residual"] > 0 and launched["silu_gate"] > 0 and launched["qkv_rope"] > 0, launched
    assert rel(out, run(exact, 0, 7)) <= 1e-5
