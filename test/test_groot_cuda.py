"""GR00T N1.5 on CUDA (``fast``, float32, the tiny LeRobot checkpoint): the engine's captured graphs against its
eager bodies, capsules through the graphs, and the GPU's actions against the CPU's.

GPU only (each test skips on a machine without CUDA, saying so); about a minute on an H100. These are the first
checks a device session runs before the published-size race (``benchmarks.groot``): a CUDA-only fault (a body
that reads the host, an op the graph cannot hold, a resize that rounds otherwise on the GPU) shows here on a tiny
checkpoint in seconds instead of after a 19 GB build.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_groot import N, rel, run, tiny_checkpoint
from flashrt_ros.engine.policy_engine import PolicyEngine
from flashrt_ros.engine.vla import reinstruct, set_instruction
from flashrt_ros.models.lerobot.factory import load_lerobot_policy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graph capture)")
TASK, OTHER = "pick up the red cube", "put the cube in the box"
#: a captured body against the same body run eagerly on the same GPU: the same kernels in the same order, so
#: float32 rounding at most (test_pi0_cuda.py's bound)
SAME_DEVICE = 1e-5
#: the GPU against the CPU's ``exact`` (LeRobot's bits, test_groot_policy.py), TF32 off: every product and
#: reduction may sum in another order, ~1e-6 of a value per operation through 2 LLM layers, 2 VL blocks, 4 DiT
#: blocks and 4 Euler steps; 1e-4 leaves a factor of ~10 for that, and is far below what one wrong pixel level
#: or a dropped mask moves (6.8e-4, test_groot_fast.py). Declared before any GPU run.
CROSS_DEVICE = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("groot_cuda"))


@pytest.fixture(autouse=True)
def no_tf32():
    """TF32 off for products and convolutions (SigLIP's patch embedding): float32 means float32 here."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def make_engine(checkpoint: Path, tmp_path, name: str, graphs: bool, device: str = "cuda",
                numerics: str = "fast") -> PolicyEngine:
    engine = PolicyEngine(load_lerobot_policy(checkpoint, numerics=numerics), device=device, cuda_graph=graphs,
                          directory=str(tmp_path / name), rollback_depth=4)
    set_instruction(engine, TASK)
    return engine


def test_captured_graphs_replay_eager_and_restore_bit_identically(checkpoint, tmp_path):
    """17 steps (plans at 0, 5, 10, 15) through the graphs equal the eager bodies; a snapshot mid-chunk, other
    work (a re-instruction: a reset and a replan), a restore, and the continuation is the one without them, to
    the bit, twice; a redraw through its graph equals the eager redraw."""
    eager, graph = make_engine(checkpoint, tmp_path, "e", False), make_engine(checkpoint, tmp_path, "g", True)
    assert graph.status()["cuda_graph"] and not eager.status()["cuda_graph"]
    reference = run(eager, 0, 17)
    first = run(graph, 0, 7)
    graph.capsules.snapshot("mid")
    run(graph, 50, 9)
    reinstruct(graph, OTHER)
    graph.capsules.restore("mid")
    rest = run(graph, 7, 10)
    error = rel(torch.cat([first, rest]), reference)
    print(f"graphs vs eager (CUDA): {error:.3g} of the largest action")
    assert error <= SAME_DEVICE
    graph.capsules.restore("mid")
    assert torch.equal(run(graph, 7, 10), rest)
    graph.redraw(3)
    eager.redraw(3)
    q = graph.policy.QUEUE
    assert rel(graph.arena[q].cpu(), eager.arena[q].cpu()) <= SAME_DEVICE


def test_the_gpu_plans_what_the_cpu_plans(checkpoint, tmp_path):
    """The captured CUDA episode against the CPU's ``exact`` one (LeRobot's bits): the images resized and
    normalised on the GPU, the Eagle language model, the DiT, the Euler steps."""
    cpu = run(make_engine(checkpoint, tmp_path, "cpu", False, device="cpu", numerics="exact"), 0, 3 * N)
    gpu = run(make_engine(checkpoint, tmp_path, "gpu", True), 0, 3 * N)
    error = rel(gpu, cpu)
    print(f"CUDA fast (graphs) vs CPU exact: {error:.3g} of the largest action")
    assert error <= CROSS_DEVICE


def test_reinstruct_through_the_graph_equals_a_cold_graph_replan(checkpoint, tmp_path):
    """A fork re-instructed from the stored image tokens (the replan-from-context graph, no SigLIP) and its
    continuation through the next replans equal an engine that had that instruction from the start."""
    source = make_engine(checkpoint, tmp_path, "src", True)
    run(source, 0, 2)                                                     # replan on observation 0, one pop
    source.capsules.snapshot("scene")
    source.capsules.fork("scene", "branch")
    source.capsules.restore("branch")
    reinstruct(source, OTHER)
    assert not source.next_step_replans()                                 # the queue is full again
    forked = run(source, 0, 2 * N + 1)                                    # pops, then replans on obs N, 2N
    cold = make_engine(checkpoint, tmp_path, "cold", True)
    set_instruction(cold, OTHER)
    assert rel(forked, run(cold, 0, 2 * N + 1)) <= SAME_DEVICE
