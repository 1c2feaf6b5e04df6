"""π0 / π0.5 in the ``fast`` numerics on the CPU (tiny sizes): the same function as ``exact``, the same state.

What a plan computes with is free, what it touches is not: ``fast`` (fused projections, folded norms, the row
kernels' torch references, SDPA) must give ``exact``'s actions within float32 rounding, and keep every capsule
property ``exact`` has: mid-chunk restore, a plan in flight, re-instruct by fork, what a plan writes, no host read
in a body. The triton kernels themselves are ``test_fused_rows.py``; on a GPU, ``test_pi0_cuda.py``.
"""
from __future__ import annotations

import pytest
import torch

from host_reads import no_host_reads
from tiny_pi import tiny_observation, tiny_pi
from flashrt_ros.engine.chunk_planner import ACTIVE, ReplanConfig
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import reinstruct, set_instruction
from flashrt_ros.models.policy_interface import Guidance
from flashrt_ros.models.rtc import prefix_weights
from flashrt_ros.runtime.errors import FingerprintMismatch, InvalidArgument

TASK, OTHER = "pick up the red cube", "open the drawer"
KINDS = {"pi0": False, "pi05": True}


def policy(pi05: bool, numerics: str, dtype: torch.dtype = torch.float32, attention: str = "sdpa"):
    p = tiny_pi(pi05)
    if dtype != torch.float32:
        p.cast(dtype)
    p.use_numerics(numerics)
    if numerics == "fast":
        p.fast.attention = attention
    return p


def make_engine(tmp_path, pi05: bool, numerics: str = "fast", name: str = "e", replan: str = "sync",
                dtype: torch.dtype = torch.float32, attention: str = "sdpa") -> PolicyEngine:
    cfg = ReplanConfig(mode=replan, delay_steps=2, late="wait", rtc_horizon=4)
    engine = PolicyEngine(policy(pi05, numerics, dtype, attention), directory=str(tmp_path / name),
                          rollback_depth=4, replan=cfg)
    set_instruction(engine, TASK)
    return engine


def run(engine: PolicyEngine, start: int, n: int) -> torch.Tensor:
    return torch.stack([engine.step(tiny_observation(start + i, engine.policy.cfg)) for i in range(n)])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


@pytest.mark.parametrize("attention", ["sdpa", "kernel"])
@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_equals_exact_within_rounding(kind, dtype, tolerance, attention, tmp_path):
    """Three chunks and their pops, the prefix KV rows (zeros past the prompt) and the stored image tokens;
    both attentions (on the CPU ``kernel`` runs ``ops.prefix_attention``'s reference: the masks' wiring)."""
    exact = make_engine(tmp_path, KINDS[kind], "exact", "x", dtype=dtype)
    fast = make_engine(tmp_path, KINDS[kind], "fast", "f", dtype=dtype, attention=attention)
    assert rel(run(fast, 0, 15), run(exact, 0, 15)) <= tolerance
    p = exact.policy
    for name in (p.KEY + "0", p.VALUE + "1", p.IMAGES):
        assert rel(fast.arena[name], exact.arena[name]) <= tolerance, name
    assert torch.equal(fast.arena[p.PREFIX_LEN], exact.arena[p.PREFIX_LEN])
    valid = int(exact.arena[p.PREFIX_LEN])
    assert (fast.arena[p.KEY + "0"][valid:] == 0).all()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_rtc_guided_fast_plan_equals_exact_within_rounding(kind):
    cfg = tiny_pi(KINDS[kind]).cfg
    guide = Guidance(torch.randn(cfg.n_action_steps, cfg.action_dim, generator=torch.Generator().manual_seed(1)),
                     torch.tensor(3), prefix_weights(2, 4, cfg.chunk_size, "linear"))
    queues = {}
    for numerics in ("exact", "fast"):
        engine = PolicyEngine(policy(KINDS[kind], numerics))
        set_instruction(engine, TASK)
        with torch.no_grad():
            engine.policy.plan(tiny_observation(0, cfg), engine.arena, guide)
        queues[numerics] = engine.arena[engine.policy.QUEUE].clone()
    assert rel(queues["fast"], queues["exact"]) <= 1e-5


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_snapshot_mid_chunk_other_work_restore_is_bit_identical(kind, tmp_path):
    uninterrupted = run(make_engine(tmp_path, KINDS[kind], name="ref"), 0, 17)
    engine = make_engine(tmp_path, KINDS[kind])
    first = run(engine, 0, 7)
    engine.capsules.snapshot("mid")
    set_instruction(engine, OTHER)
    run(engine, 50, 9)
    engine.capsules.reset(seed=7)
    run(engine, 80, 3)
    engine.capsules.restore("mid")
    assert torch.equal(torch.cat([first, run(engine, 7, 10)]), uninterrupted)


@pytest.mark.parametrize("mode", ["async", "rtc"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_capsule_with_a_plan_in_flight_continues_bit_identically(kind, mode, tmp_path):
    engine = make_engine(tmp_path, KINDS[kind], replan=mode)
    run(engine, 0, 4)
    assert int(engine.arena[ACTIVE]) == 1, "a plan is in flight at the snapshot"
    engine.capsules.snapshot("in_flight")
    once = run(engine, 4, 12)
    engine.capsules.restore("in_flight")
    assert torch.equal(once, run(engine, 4, 12))
    engine.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_reinstruct_by_fork_equals_a_cold_replan(kind, tmp_path):
    engine = make_engine(tmp_path, KINDS[kind])
    n = engine.policy.cfg.n_action_steps
    run(engine, 0, 2)
    engine.capsules.snapshot("scene")
    engine.capsules.fork("scene", "branch")
    engine.capsules.restore("branch")
    reinstruct(engine, OTHER)
    forked = run(engine, 0, 2 * n + 1)
    cold = make_engine(tmp_path, KINDS[kind], name="cold")
    set_instruction(cold, OTHER)
    assert torch.equal(forked, run(cold, 0, 2 * n + 1))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_fast_plan_writes_exactly_the_buffers_its_action_queue_names(kind, tmp_path):
    engine = make_engine(tmp_path, KINDS[kind])
    p, arena, queue = engine.policy, engine.arena, engine.policy.action_queue()
    run(engine, 0, 2)
    set_instruction(engine, "open")
    before = {name: arena[name].clone() for name in arena}
    ahead = torch.zeros(queue.ahead, p.cfg.action_dim)
    with torch.no_grad():
        p.plan(tiny_observation(3, p.cfg), arena, None, ahead)
    assert {name for name in arena if not torch.equal(arena[name], before[name])} == \
        {queue.chunk, queue.left, *queue.planned}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_bodies_read_nothing_on_the_host(kind, tmp_path, monkeypatch):
    engine = make_engine(tmp_path, KINDS[kind])
    p, arena = engine.policy, engine.arena
    cfg = p.cfg
    obs = tiny_observation(0, cfg)
    guide = Guidance(torch.randn(cfg.n_action_steps, cfg.action_dim), torch.tensor(3),
                     prefix_weights(2, 3, cfg.chunk_size, "linear"))
    with no_host_reads(monkeypatch):
        p.step_observation(obs, arena, replan=True)
        p.step_observation(obs, arena, replan=False)
        p.redraw_chunk(arena)
        p.replan_from_context(arena)
        p.plan(obs, arena, guide)
    assert int(arena[p.LEFT]) == cfg.n_action_steps


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fp8_numerics_quantise_the_products_and_keep_the_function(kind, tmp_path):
    """``fp8``: every language-model and expert product's weights in float8 E4M3 with a float32 scale per output
    row (the widened weights on CPU: the same function a GPU computes with the scaled matmul and the fused kernels);
    the actions move by quantisation (5 % at these tiny random sizes, measured 2026-12-07), not more."""
    exact = make_engine(tmp_path, KINDS[kind], "exact", "x")
    fast = make_engine(tmp_path, KINDS[kind], "fast", "f", dtype=torch.bfloat16)
    fp8 = make_engine(tmp_path, KINDS[kind], "fp8", "8", dtype=torch.bfloat16)
    for layer in (*fp8.policy.model.language_model.layers, *fp8.policy.model.expert.layers):
        for name in ("qkv", "o", "gate_up", "down"):
            weight, scale = getattr(layer, name), getattr(layer, f"{name}_scale")
            assert weight.dtype == torch.float8_e4m3fn and scale.shape == (weight.shape[0],), name
    reference, with_fp8 = run(exact, 0, 15), run(fp8, 0, 15)
    assert 1e-3 < rel(with_fp8, run(fast, 0, 15)) and rel(with_fp8, reference) <= 0.15
    assert fp8.fingerprint != fast.fingerprint
    with pytest.raises(InvalidArgument, match="dtype bfloat16"):
        tiny_pi(KINDS[kind]).use_numerics("fp8")                 # float32 activations: refused, naming the fix


def test_a_capsule_of_one_numerics_is_refused_by_the_other(tmp_path):
    """The numerics are part of the fingerprint: a capsule file written by an exact engine is not loaded by a
    fast one over the same weights (its KV rows were computed with other rounding); and a policy's numerics
    are chosen once."""
    exact = make_engine(tmp_path, False, "exact", "shared")
    run(exact, 0, 3)
    exact.capsules.snapshot("home")
    exact.capsules.save("home")
    fast = make_engine(tmp_path, False, "fast", "shared")
    assert exact.fingerprint != fast.fingerprint
    with pytest.raises(FingerprintMismatch):
        fast.capsules.load("home")
    p = tiny_pi(False)
    p.use_numerics("fast")
    with pytest.raises(InvalidArgument, match="choose it once"):
        p.use_numerics("exact")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_fast_plan_through_its_triton_kernels_equals_exact(kind, tmp_path, monkeypatch):
    """The kernels the GPU runs, in the plan, on the CPU: triton's interpreter takes every fused kernel (the row
    kernels, the few-row products with RoPE / gated GELU / residual fused, the split-key attention of the expert
    and the one-pass one of the prefix) and the whole plan must give ``exact``'s actions within float32
    rounding (head dim 32: the few-row RoPE kernel's smallest)."""
    from triton_interpret import INTERPRET, needs_triton
    if needs_triton.args[0] or not INTERPRET:
        pytest.skip("needs triton's interpreter (a GPU runs the same kernels in test_pi0_cuda.py)")
    from flashrt_ros.models.lerobot.pi0.gemma import GemmaSizes
    from flashrt_ros.ops import fused_rows, prefix_attention, rows_matmul
    heads = dict(num_heads=2, num_kv_heads=1, head_dim=32, vocab_size=256)
    sizes = dict(vlm=GemmaSizes(width=64, depth=2, mlp_dim=96, **heads),
                 expert=GemmaSizes(width=48, depth=2, mlp_dim=64, **heads))
    engines = {}
    for numerics in ("exact", "fast"):
        p = tiny_pi(KINDS[kind], **sizes)
        p.use_numerics(numerics)
        if numerics == "fast":
            p.fast.attention = "kernel"
        engines[numerics] = PolicyEngine(p, directory=str(tmp_path / numerics))
        set_instruction(engines[numerics], TASK)
    calls = {"rows": 0, "attention": 0}

    def counted(name):
        def use(x: torch.Tensor) -> bool:
            calls[name] += 1
            return True
        return use
    monkeypatch.setattr(fused_rows, "use_triton", lambda x: True)
    monkeypatch.setattr(rows_matmul, "use_triton", counted("rows"))
    monkeypatch.setattr(prefix_attention, "use_triton", counted("attention"))
    fast = run(engines["fast"], 0, 7)
    monkeypatch.undo()
    assert calls["rows"] > 0 and calls["attention"] > 0
    assert rel(fast, run(engines["exact"], 0, 7)) <= 1e-5
