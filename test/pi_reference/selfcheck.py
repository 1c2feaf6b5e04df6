"""Checks of the π reference shim, run in the reference process (``python -m pi_reference.selfcheck``).

What it checks, on small random Gemma / PaliGemma models built by transformers 4.53.2:
the plain norm is transformers' own; an adaRMS norm whose ``dense`` is zero
normalises without scale and gates its block shut (the layer passes its input
through); a prefix cache read with ``use_cache=False`` is not grown and gives the
same suffix states as one joint pass over prefix and suffix; the model does not
scale its input embeddings; the image features are not divided by
``sqrt(width)``; LeRobot's ``PI0Policy`` and ``PI05Policy`` build (its version
check passes) and ``select_action`` returns finite actions. Prints one line per
check; exits non-zero on the first failure.
"""
from __future__ import annotations

import sys

import torch


def _gemma(use_adarms: bool = False, layers: int = 2):
    from transformers import GemmaConfig
    from transformers.models.gemma.modeling_gemma import GemmaModel
    config = GemmaConfig(vocab_size=32, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=16, use_adarms=use_adarms,
                         adarms_cond_dim=64 if use_adarms else None)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GemmaModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _mask(rows: torch.Tensor) -> torch.Tensor:
    """A boolean ``(L, S)`` visibility as the additive 4-D mask LeRobot passes."""
    return torch.where(rows, 0.0, -2.3819763e38)[None, None]


def check_plain_norm_is_stock() -> None:
    from pi_reference import transformers_shim as shim
    stock, ours = shim.STOCK_RMSNORM(64, eps=1e-6), shim.ConditionedRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        w = torch.randn(64)
        stock.weight.copy_(w)
        ours.weight.copy_(w)
    x = torch.randn(3, 5, 64)
    out, gate = ours(x)
    assert gate is None and torch.equal(out, stock(x)), "plain norm differs from transformers' GemmaRMSNorm"


def check_zero_adarms_gates_the_layer_shut() -> None:
    from pi_reference import transformers_shim as shim
    model = _gemma(use_adarms=True, layers=1)
    layer = model.layers[0]
    assert isinstance(layer.input_layernorm, shim.ConditionedRMSNorm) and layer.input_layernorm.dense is not None
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.dense.weight.zero_()
            norm.dense.bias.zero_()
    x, cond = torch.randn(1, 5, 64), torch.randn(1, 64)
    normed, gate = layer.input_layernorm(x, cond)
    plain = shim.STOCK_RMSNORM(64, eps=layer.input_layernorm.eps)(x)          # weight 0: scale 1
    assert torch.allclose(normed, plain, atol=1e-6) and torch.equal(gate, torch.zeros_like(gate))
    rotary = model.rotary_emb(x, torch.arange(5)[None])
    out = layer(x, attention_mask=_mask(torch.ones(5, 5, dtype=torch.bool)), position_embeddings=rotary,
                adarms_cond=cond)[0]
    assert torch.equal(out, x), "a zero gate must leave the residual stream unchanged"


def check_prefix_cache_is_read_not_grown() -> None:
    model = _gemma()
    prefix, suffix = torch.randn(1, 6, 64), torch.randn(1, 3, 64)
    with torch.no_grad():
        cache = model(inputs_embeds=prefix, attention_mask=_mask(torch.ones(6, 6, dtype=torch.bool)),
                      position_ids=torch.arange(6)[None], use_cache=True).past_key_values
        visible = torch.ones(3, 9, dtype=torch.bool)
        runs = [model(inputs_embeds=suffix, attention_mask=_mask(visible), position_ids=torch.arange(6, 9)[None],
                      past_key_values=cache, use_cache=False).last_hidden_state for _ in range(2)]
        assert cache.get_seq_length() == 6, f"the prefix cache grew to {cache.get_seq_length()}"
        assert torch.equal(runs[0], runs[1])
        rows = torch.ones(9, 9, dtype=torch.bool)
        rows[:6, 6:] = False                                   # the prefix does not see the suffix
        joint = model(inputs_embeds=torch.cat([prefix, suffix], 1), attention_mask=_mask(rows),
                      position_ids=torch.arange(9)[None], use_cache=False).last_hidden_state
    err = float((joint[:, 6:] - runs[0]).abs().max())
    assert err < 1e-5, f"suffix over the cached prefix differs from the joint pass by {err}"


def check_inputs_are_not_scaled() -> None:
    model = _gemma(layers=1)
    x = torch.randn(1, 4, 64)
    mask, pos = _mask(torch.ones(4, 4, dtype=torch.bool)), torch.arange(4)[None]
    with torch.no_grad():
        out = model(inputs_embeds=x, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        by_hand = model.layers[0](x, attention_mask=mask, position_embeddings=model.rotary_emb(x, pos))[0]
        by_hand, _ = model.norm(by_hand)
    assert torch.equal(out, by_hand), "GemmaModel must feed its input embeddings unscaled"


def check_image_features_are_not_rescaled() -> None:
    from transformers import PaliGemmaConfig
    from transformers.models.paligemma.modeling_paligemma import PaliGemmaModel
    config = PaliGemmaConfig(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           patch_size=14, image_size=28, projection_dim=64),
        text_config=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=16, vocab_size=32), projection_dim=64)
    model = PaliGemmaModel(config).eval()
    px = torch.rand(1, 3, 28, 28)
    with torch.no_grad():
        expected = model.multi_modal_projector(model.vision_tower(px).last_hidden_state)
        assert torch.equal(model.get_image_features(px), expected)


def check_lerobot_pi_policies_run() -> None:
    from lerobot.configs.types import FeatureType, PolicyFeature
    from pi_reference.reference import REDUCED, _reduce
    from transformers.models.siglip import check
    assert check.check_whether_transformers_replace_is_installed_correctly()
    for kind in ("pi0", "pi05"):
        if kind == "pi0":
            from lerobot.policies.pi0 import modeling_pi0 as modeling
            from lerobot.policies.pi0.configuration_pi0 import PI0Config as config_cls
        else:
            from lerobot.policies.pi05 import modeling_pi05 as modeling
            from lerobot.policies.pi05.configuration_pi05 import PI05Config as config_cls
        _reduce(modeling, REDUCED)
        config = config_cls(input_features={"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(4,)),
                                            "observation.images.top": PolicyFeature(type=FeatureType.VISUAL,
                                                                                    shape=(3, 56, 56))},
                            output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(3,))},
                            image_resolution=(56, 56), chunk_size=4, n_action_steps=2, device="cpu")
        policy = (modeling.PI05Policy if kind == "pi05" else modeling.PI0Policy)(config).eval()
        batch = {"observation.state": torch.randn(1, 4), "observation.images.top": torch.rand(1, 3, 56, 56),
                 "observation.language.tokens": torch.randint(0, 100, (1, 8)),
                 "observation.language.attention_mask": torch.ones(1, 8, dtype=torch.bool)}
        action = policy.select_action(batch)
        assert action.shape == (1, 3) and torch.isfinite(action).all(), f"{kind}: {action}"


def main() -> int:
    from pi_reference.reference import _install
    _install()
    for name, check in [(n, f) for n, f in globals().items() if n.startswith("check_")]:
        check()
        print(f"[selfcheck] {name}: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
