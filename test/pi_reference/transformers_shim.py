"""openpi's changes to transformers 4.53.2, re-implemented as a patch applied at import (test-only).

Why: LeRobot 0.4.4's π0 / π0.5 build their PaliGemma + Gemma expert from
transformers, but only from the copy openpi patches (its
``models_pytorch/transformers_replace`` overwrites transformers' gemma, paligemma
and siglip modules). That copy is not on the package registry. This module takes
stock transformers 4.53.2 and changes, at run time, exactly what LeRobot relies on:

1. ``GemmaRMSNorm`` becomes ``ConditionedRMSNorm``: the same normalisation
   (``x * rsqrt(mean(x^2) + eps)`` in float32, times ``1 + weight``), returning
   ``(normed, None)``; with a condition width (adaRMS, π0.5's expert) it has no
   ``weight`` but a ``dense`` linear ``cond -> 3 * dim`` whose output splits into
   scale, shift and gate: ``normed * (1 + scale) + shift`` and the gate is returned;
2. ``GemmaDecoderLayer``: built with adaRMS norms when its config says
   ``use_adarms`` (width ``adarms_cond_dim``, default ``hidden_size``); its forward
   takes ``adarms_cond`` and adds each sub-block's output through the gate
   (``x + gate * y``; plain ``x + y`` without one);
3. ``GemmaModel``: its final ``norm`` follows the same rule; its forward takes
   ``adarms_cond``, does **not** multiply the input embeddings by
   ``sqrt(hidden_size)`` (LeRobot scales the language embeddings itself), casts
   the inputs to bfloat16 when the layers are bfloat16, and, given a prefix cache
   with ``use_cache=False``, attends to that cache's keys/values followed by the
   new ones **without appending to the cache** (stock code would grow it on every
   denoising step);
4. ``GemmaPreTrainedModel._init_weights`` skips norms without a ``weight``;
5. ``PaliGemmaModel.get_image_features`` no longer divides the projected image
   features by ``sqrt(text hidden_size)``;
6. ``SiglipVisionTransformer``: the patch embeddings are cast to bfloat16 when the
   encoder runs in bfloat16;
7. ``transformers.models.siglip.check`` exists (LeRobot refuses to build π0 without
   it) and says whether transformers is 4.53.2.

One difference on purpose: openpi creates the plain norm weights in bfloat16;
here they take the default dtype. LeRobot casts the whole model to its
``dtype`` (and the norms back to float32 in bfloat16 mode) right after
construction, so no computation sees the difference.
"""
from __future__ import annotations

import sys
import types

import torch
from torch import nn

TRANSFORMERS_VERSION = "4.53.2"
STOCK_RMSNORM = None                         # transformers' own GemmaRMSNorm, once ``install`` ran


class ConditionedRMSNorm(nn.Module):
    """Gemma's RMSNorm, optionally adaRMS-conditioned; ``forward(x, cond=None) -> (normed, gate or None)``."""

    def __init__(self, dim: int, eps: float = 1e-6, cond_dim: int | None = None) -> None:
        super().__init__()
        self.dim, self.eps, self.cond_dim = dim, eps, cond_dim
        if cond_dim is None:
            self.weight = nn.Parameter(torch.zeros(dim))
            self.dense = None
        else:
            self.dense = nn.Linear(cond_dim, 3 * dim)
            nn.init.zeros_(self.dense.weight)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None):
        normed = x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + self.eps)     # float32
        if self.dense is None:
            return (normed * (1.0 + self.weight.float())).to(x.dtype), None
        if cond is None:
            raise ValueError("an adaRMS norm needs its condition")
        if cond.shape[-1] != self.cond_dim:
            raise ValueError(f"adaRMS condition has width {cond.shape[-1]}, expected {self.cond_dim}")
        modulation = self.dense(cond)
        if x.dim() == 3:
            modulation = modulation[:, None, :]
        scale, shift, gate = modulation.chunk(3, dim=-1)
        return (normed * (1.0 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}" + (f", cond_dim={self.cond_dim}" if self.dense is not None else "")


def gated_residual(residual: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return residual + update if gate is None else residual + update * gate


class ReadOnlyPrefix:
    """A cache seen through ``update`` as "prefix keys/values, then these", never written."""

    def __init__(self, cache) -> None:
        self.cache = cache

    def update(self, key, value, layer_idx, cache_kwargs=None):
        prefix_key, prefix_value = self.cache[layer_idx]
        return torch.cat([prefix_key, key], dim=2), torch.cat([prefix_value, value], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cache.get_seq_length(layer_idx)


def _cond_dim(config) -> int | None:
    if not getattr(config, "use_adarms", False):
        return None
    return getattr(config, "adarms_cond_dim", None) or config.hidden_size


def _patch_gemma() -> None:
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_outputs import BaseModelOutputWithPast
    from transformers.models.gemma import modeling_gemma as g

    global STOCK_RMSNORM
    STOCK_RMSNORM = g.GemmaRMSNorm            # kept for the self-check
    g.GemmaRMSNorm = ConditionedRMSNorm       # every Gemma norm built from here on (layers, final norm)
    layer_init, model_init, init_weights = g.GemmaDecoderLayer.__init__, g.GemmaModel.__init__, \
        g.GemmaPreTrainedModel._init_weights

    def decoder_layer_init(self, config, layer_idx):
        layer_init(self, config, layer_idx)
        cond = _cond_dim(config)
        if cond is not None:
            self.input_layernorm = ConditionedRMSNorm(config.hidden_size, config.rms_norm_eps, cond)
            self.post_attention_layernorm = ConditionedRMSNorm(config.hidden_size, config.rms_norm_eps, cond)

    def decoder_layer_forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_value=None,
                              output_attentions=False, use_cache=False, cache_position=None,
                              position_embeddings=None, adarms_cond=None, **kwargs):
        h, gate = self.input_layernorm(hidden_states, adarms_cond)
        h, weights = self.self_attn(hidden_states=h, attention_mask=attention_mask, position_ids=position_ids,
                                    past_key_value=past_key_value, output_attentions=output_attentions,
                                    use_cache=use_cache, cache_position=cache_position,
                                    position_embeddings=position_embeddings, **kwargs)
        hidden_states = gated_residual(hidden_states, h, gate)
        h, gate = self.post_attention_layernorm(hidden_states, adarms_cond)
        hidden_states = gated_residual(hidden_states, self.mlp(h), gate)
        return (hidden_states, weights) if output_attentions else (hidden_states,)

    def model_init_(self, config):
        model_init(self, config)
        cond = _cond_dim(config)
        if cond is not None:
            self.norm = ConditionedRMSNorm(config.hidden_size, config.rms_norm_eps, cond)

    def model_forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                      inputs_embeds=None, use_cache=None, output_attentions=None, output_hidden_states=None,
                      cache_position=None, adarms_cond=None, **kwargs):
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache()
        if cache_position is None:
            seen = past_key_values.get_seq_length() if past_key_values is not None else 0
            cache_position = torch.arange(seen, seen + inputs_embeds.shape[1], device=inputs_embeds.device)
        if position_ids is None:
            position_ids = cache_position[None, :]
        mask = create_causal_mask(config=self.config, input_embeds=inputs_embeds, attention_mask=attention_mask,
                                  cache_position=cache_position, past_key_values=past_key_values,
                                  position_ids=position_ids)
        hidden = inputs_embeds
        if len(self.layers) and self.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16:
            hidden = hidden.to(torch.bfloat16)
        rotary = self.rotary_emb(hidden, position_ids)      # no sqrt(hidden_size) scaling of the inputs
        cache = past_key_values if use_cache or past_key_values is None else ReadOnlyPrefix(past_key_values)
        for layer in self.layers[: self.config.num_hidden_layers]:
            hidden = layer(hidden, attention_mask=mask, position_ids=position_ids, past_key_value=cache,
                           use_cache=use_cache, cache_position=cache_position, position_embeddings=rotary,
                           adarms_cond=adarms_cond, **kwargs)[0]
        hidden, _ = self.norm(hidden, adarms_cond)
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=past_key_values if use_cache else None)

    def init_weights_(self, module):
        if isinstance(module, ConditionedRMSNorm) and module.dense is not None:
            return                                  # its ``dense`` is initialised as the Linear it is
        init_weights(self, module)

    g.GemmaDecoderLayer.__init__ = decoder_layer_init
    g.GemmaDecoderLayer.forward = decoder_layer_forward
    g.GemmaModel.__init__ = model_init_
    g.GemmaModel.forward = model_forward
    g.GemmaPreTrainedModel._init_weights = init_weights_


def _patch_paligemma_and_siglip() -> None:
    from transformers.models.paligemma import modeling_paligemma as p
    from transformers.models.siglip import modeling_siglip as s

    def get_image_features(self, pixel_values):
        return self.multi_modal_projector(self.vision_tower(pixel_values).last_hidden_state)   # no 1/sqrt(d)

    p.PaliGemmaModel.get_image_features = get_image_features
    vision_init = s.SiglipVisionTransformer.__init__

    def vision_init_(self, config):
        vision_init(self, config)
        encoder = self.encoder

        def to_encoder_dtype(_module, _inputs, output):
            layers = encoder.layers
            if len(layers) and layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16:
                return output.to(torch.bfloat16)
            return output
        self.embeddings.register_forward_hook(to_encoder_dtype)

    s.SiglipVisionTransformer.__init__ = vision_init_


def _add_check_module() -> None:
    import transformers

    check = types.ModuleType("transformers.models.siglip.check")
    check.check_whether_transformers_replace_is_installed_correctly = \
        lambda: transformers.__version__ == TRANSFORMERS_VERSION
    sys.modules[check.__name__] = check
    import transformers.models.siglip as siglip
    siglip.check = check


_installed = False


def install() -> None:
    """Patch the imported transformers (must be 4.53.2) before any π model is built; idempotent."""
    global _installed
    if _installed:
        return
    import transformers
    if transformers.__version__ != TRANSFORMERS_VERSION:
        raise RuntimeError(f"the π reference shim patches transformers {TRANSFORMERS_VERSION}, "
                           f"found {transformers.__version__} at {transformers.__file__}")
    _patch_gemma()
    _patch_paligemma_and_siglip()
    _add_check_module()
    _installed = True
