"""On CUDA, decode steps replayed as captured graphs equal eager steps and survive restores.

Skipped without a CUDA device (the development machines have none; run it on the GPU machine).
"""
import pytest
import torch

from flashrt_ros.engine import LLMEngine, SamplingParams
from flashrt_ros.models.registry import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPT = "Graphs replay into the same addresses."


def engines(source: str):
    model, tok, _, fp = load_model(source, device="cuda", seed=0)
    make = lambda graphs: LLMEngine(model, tok, max_context=256, device="cuda", prefill_chunk=16,  # noqa: E731
                                    fingerprint_inputs=fp, cuda_graphs=graphs)
    return make(False), make(True)


@pytest.mark.parametrize("source", ["random-llama-tiny", "random-hybrid-tiny"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=3)])
def test_graph_replay_matches_eager(source, sampling):
    eager, graph = engines(source)
    a = eager.generate(PROMPT, max_new_tokens=24, sampling=sampling, stop_ids=[]).token_ids
    b = graph.generate(PROMPT, max_new_tokens=24, sampling=sampling, stop_ids=[]).token_ids
    assert a == b
    assert any(r.graph is not None for r in graph._runners.values())


def test_restore_under_captured_graphs_reproduces_tokens():
    _, graph = engines("random-hybrid-tiny")
    graph.generate(PROMPT, max_new_tokens=5, stop_ids=[])
    graph.snapshot("g")
    rest = graph.generate([], max_new_tokens=12, stop_ids=[]).token_ids
    graph.generate(" detour", max_new_tokens=5, stop_ids=[])
    graph.restore("g")
    assert graph.generate([], max_new_tokens=12, stop_ids=[]).token_ids == rest
    assert graph.verify("g").ok
