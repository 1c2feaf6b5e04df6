"""SmolLM2-135M from the packaged GGUF: parity with transformers on the same file, and sensible text.

One module-scoped fixture loads both models once (transformers dequantises the
GGUF itself; this is the slow part of the module, ~15-25 s on two cores).
"""
import time

import pytest
import torch

from flashrt_ros.engine import LLMEngine
from flashrt_ros.models.registry import load_model, smollm2_gguf_path
from flashrt_ros.runtime.arena import StateArena, core_meta_specs

PROMPT = "Name three colours."


@pytest.fixture(scope="module")
def models():
    from transformers import AutoModelForCausalLM
    path = smollm2_gguf_path()
    start = time.perf_counter()
    ours, tokenizer, config, fingerprint_inputs = load_model("smollm2")
    load_s = time.perf_counter() - start
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()
    return dict(ours=ours, hf=hf, tokenizer=tokenizer, config=config, fp=fingerprint_inputs, load_s=load_s)


def test_config_comes_from_gguf_metadata(models):
    cfg = models["config"]
    assert (cfg["n_layers"], cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]) == (30, 576, 9, 3)
    assert cfg["rope_theta"] == 100000.0 and cfg["tie_embeddings"] is True
    assert len(models["fp"].extra["gguf_sha256"]) == 64
    print(f"\nSmolLM2 load (GGUF read + dequantise + tokenizer): {models['load_s']:.1f} s")


@torch.no_grad()
def test_prompt_logits_match_transformers(models):
    ours, hf, tok = models["ours"], models["hf"], models["tokenizer"]
    ids = tok.chat_ids(PROMPT, after_token=None)
    arena = StateArena(core_meta_specs() + ours.state_specs(64))
    mine = ours(torch.tensor(ids), torch.arange(len(ids)), arena)
    ref = hf(torch.tensor([ids])).logits[0].float()
    rel = float((mine - ref).abs().max() / ref.abs().max())
    print(f"\nSmolLM2 prompt logits: max abs err {float((mine - ref).abs().max()):.3g}, rel {rel:.3g}")
    assert rel <= 1e-3
    assert torch.equal(mine.argmax(-1), ref.argmax(-1))


@torch.no_grad()
def test_greedy_tokens_match_transformers_and_read_sensibly(models):
    ours, hf, tok = models["ours"], models["hf"], models["tokenizer"]
    engine = LLMEngine(ours, tok, max_context=128, fingerprint_inputs=models["fp"])
    result = engine.generate(PROMPT, chat=True, max_new_tokens=8)
    ids = tok.chat_ids(PROMPT, after_token=None)
    # Teacher-forced on our tokens, transformers' argmax at every step must be our next token:
    # the same as comparing greedy generations, in one forward pass.
    ref_logits = hf(torch.tensor([ids + result.token_ids])).logits[0, len(ids) - 1:-1]
    print(f"\nSmolLM2 greedy: {result.text!r} ({result.timings.get('decode_tokens_per_s', 0):.1f} tok/s)")
    assert ref_logits.argmax(-1).tolist() == result.token_ids
    assert result.text.startswith("1. Red")


def test_chat_template_renders_chatml_with_the_default_system_prompt(models):
    tok = models["tokenizer"]
    text = tok.hf.decode(tok.chat_ids(PROMPT, after_token=None))
    assert text.startswith("<|im_start|>system\n") and "SmolLM" in text
    assert text.endswith("<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n")
    follow_up = tok.hf.decode(tok.chat_ids("And animals?", after_token=tok.stop_ids[0]))
    assert follow_up == "\n<|im_start|>user\nAnd animals?<|im_end|>\n<|im_start|>assistant\n"


def test_tokenizer_round_trips_and_splits_digits(models):
    tok = models["tokenizer"]
    text = "Colours: rouge, grün, 青 — 2024!"
    assert tok.decode(tok.encode(text)) == text
    assert [tok.decode([i]) for i in tok.encode("2024")] == ["2", "0", "2", "4"]
