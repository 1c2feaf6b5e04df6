"""On CUDA, decode steps replayed as captured graphs equal eager steps and survive restores.

Speculative steps too (hybrid model with its MTP head, or the oracle drafter): graphs
equal eager, both equal plain decoding (float32), restores under graphs replay them.

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
    assert any(r.graph is not None for r in graph.runner.decode_runners.values())


def test_restore_under_captured_graphs_reproduces_tokens():
    _, graph = engines("random-hybrid-tiny")
    graph.generate(PROMPT, max_new_tokens=5, stop_ids=[])
    graph.capsules.snapshot("g")
    rest = graph.generate([], max_new_tokens=12, stop_ids=[]).token_ids
    graph.generate(" detour", max_new_tokens=5, stop_ids=[])
    graph.capsules.restore("g")
    assert graph.generate([], max_new_tokens=12, stop_ids=[]).token_ids == rest
    first = graph.capsules.verify("g")      # CUDA device tier: no hash taken at snapshot time
    assert first.ok or not first.verified, first.detail
    assert graph.capsules.verify("g").ok    # compares with the hashes the first verify recorded


def test_prefill_graph_of_a_chunk_that_fills_the_context_captures_and_matches_eager():
    model, tok, _, fp = load_model("random-hybrid-tiny", device="cuda", seed=0)
    make = lambda graphs: LLMEngine(model, tok, max_context=64, device="cuda", prefill_chunk=32,  # noqa: E731
                                    fingerprint_inputs=fp, cuda_graphs=graphs)
    ids = [(7 * i) % 250 + 3 for i in range(60)]             # chunks 32 + 16 + 8 + 4: the context fills up
    runs = []
    for graphs in (False, True):
        engine = make(graphs)
        assert engine.prefill(ids) == 60
        runs.append([engine.decode_step(greedy=True) for _ in range(4)])
    assert runs[0] == runs[1]
    assert sorted(engine.runner.prefill_runners) == [(4, False), (8, False), (16, False), (32, False)]


def test_warm_up_captures_every_graph_and_changes_no_state():
    _, engine = engines("random-llama-tiny")
    engine.generate(PROMPT, max_new_tokens=3, stop_ids=[])      # captures some graphs on first use
    engine.capsules.snapshot("before")
    engine.warm_up()
    runners = [*engine.runner.decode_runners.values(), *engine.runner.prefill_runners.values()]
    # every length of a 16-token chunking (one graph per length: ``first`` matters only with speculation)
    assert sorted(engine.runner.prefill_runners) == [(n, False) for n in (1, 2, 4, 8, 16)]
    assert all(r.graph is not None for r in runners)
    assert engine.capsules.verify("before", against_live=True).ok
    assert engine.warm_up() == 0                                # nothing left to capture
    _, fresh = engines("random-llama-tiny")
    fresh.generate(PROMPT, max_new_tokens=3, stop_ids=[])
    assert engine.generate(" more", max_new_tokens=8, stop_ids=[]).token_ids == \
        fresh.generate(" more", max_new_tokens=8, stop_ids=[]).token_ids


def speculative_engines(drafter_for=None, tokens: int = 3):
    """(plain eager, speculative eager, speculative with graphs) over one random hybrid model with an MTP head."""
    model, tok, _, fp = load_model("random-hybrid-tiny", device="cuda", seed=0, mtp=True)

    def make(k: int, graphs: bool) -> LLMEngine:
        return LLMEngine(model, tok, max_context=256, device="cuda", prefill_chunk=16, fingerprint_inputs=fp,
                         cuda_graphs=graphs, speculative_tokens=k,
                         drafter=drafter_for(model) if (k and drafter_for) else None)
    return make(0, False), make(tokens, False), make(tokens, True)


@pytest.mark.parametrize("drafter", ["mtp", "oracle"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=3)])
def test_speculative_graph_replay_matches_eager_and_plain(drafter, sampling):
    from flashrt_ros.engine.drafters import OracleDrafter

    plain_model_run = None
    if drafter == "oracle":
        plain, _, _ = speculative_engines()
        plain_model_run = plain.generate(PROMPT, max_new_tokens=40, stop_ids=[])
        script = plain.transcript()

        def drafter_for(model):
            oracle = OracleDrafter(model.vocab_size, 300, "cuda")
            oracle.set_script(script, [p for p in range(0, 300, 4)])
            return oracle
    else:
        drafter_for = None
    plain, eager, graph = speculative_engines(drafter_for)
    want = plain.generate(PROMPT, max_new_tokens=40, sampling=sampling, stop_ids=[])
    a = eager.generate(PROMPT, max_new_tokens=40, sampling=sampling, stop_ids=[])
    b = graph.generate(PROMPT, max_new_tokens=40, sampling=sampling, stop_ids=[])
    assert (a.token_ids, a.accepted_tokens) == (b.token_ids, b.accepted_tokens)
    assert graph.runner.decode_runners[("verify", sampling.greedy)].graph is not None
    if sampling.greedy:
        assert a.token_ids == want.token_ids
        if plain_model_run is not None:
            assert a.accepted_tokens > 0


def test_speculative_restore_under_graphs_and_warm_up():
    _, _, graph = speculative_engines()
    assert graph.warm_up() > 0
    assert ("verify", True) in graph.runner.decode_runners
    assert all(r.graph is not None for r in graph.runner.decode_runners.values())
    assert {first for _, first in graph.runner.prefill_runners} == {False, True}
    graph.generate(PROMPT, max_new_tokens=7, stop_ids=[])
    graph.capsules.snapshot("g")
    rest = graph.generate([], max_new_tokens=20, stop_ids=[])
    graph.generate(" detour", max_new_tokens=5, stop_ids=[])
    graph.capsules.restore("g")
    again = graph.generate([], max_new_tokens=20, stop_ids=[])
    assert (again.token_ids, again.drafted_tokens) == (rest.token_ids, rest.drafted_tokens)
