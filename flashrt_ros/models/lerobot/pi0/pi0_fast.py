"""π0 / π0.5's networks in the ``fast`` numerics: the same plan, the same arena buffers, other kernels.

Why: what a plan computes with is free, what state it touches is not. The
``exact`` forward passes in ``modeling_pi0.py`` keep LeRobot's arithmetic to the bit
(CPU parity); this one keeps their function and every buffer they read and
write (image tokens, state, the prefix KV rows with zeros past the prefix, its
length, the queue) but runs it as few, large kernels:

- the vision tower: all cameras as one batch (``siglip_fast``);
- the language model (prefix): folded-norm Gemma layers whose row kernel writes
  the RoPE'd keys and the values straight into the arena's KV rows
  (``gemma_fast``); bidirectional attention over the valid rows by mask;
- the expert: the prefix keys and values copied once per plan into a scratch
  buffer with room for the action rows (``multi_tensor`` copy), so each of the
  ``steps x layers`` attentions is one SDPA without a concatenation; the flow
  time's branch is precomputed for the fixed step schedule (π0: the action and
  time products folded into one, its time half a per-step bias; π0.5: every
  adaRMS norm's scale, shift and gate per step);
- the float32 products around the expert stay float32 (as LeRobot keeps them
  in bf16 mode), the velocity and the Euler sum too.

``FastPi`` is built from a loaded, cast policy and takes its layers' weights
(the unfused ones are dropped): a policy is in one numerics for its life. With ``fp8`` the
language model's and the expert's four products per layer keep their weights in float8 E4M3
with a scale per output row (``ops.fp8``: the expert's few rows through the fused kernels,
weight-only; the prefix's rows through the scaled matmul); the vision tower, the embeddings
and the float32 products around the expert stay as they are.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.pi0.gemma_fast import (FastGemmaLayer, ada_residual_norm, adarms_tables, additive_mask,
                                                   single_key_head_attention)
from flashrt_ros.models.lerobot.siglip_fast import FastVisionModel
from flashrt_ros.models.policy_interface import Guidance, queue_chunk
from flashrt_ros.models.rtc import integrate_flow
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.ops.fused_rows import residual_norm, rope_tables
from flashrt_ros.ops.prefix_attention import prefix_attention
from flashrt_ros.ops.rows_matmul import matmul_rows
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.errors import InvalidArgument

ALIGN = 16                      # SDPA's memory-efficient kernel wants key counts in multiples of 16
#: how the attentions run: ``sdpa`` (SDPA's memory-efficient kernel under an additive mask; measured on an
#: H100) or ``kernel`` (``ops.prefix_attention``: the mask as arithmetic on the key index; checked against
#: its reference on the CPU in float32, not yet run on a GPU: ``benchmarks.pi0 --attention kernel``)
ATTENTIONS = ("sdpa", "kernel")


class FastPi(nn.Module):
    """The fused weights and precomputed tables of one π0 / π0.5 policy (see the module doc)."""

    def __init__(self, policy, attention: str = "sdpa", fp8: bool = False) -> None:
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: one of {ATTENTIONS}")
        if fp8 and policy.dtype != torch.bfloat16:
            raise InvalidArgument(f"π0 numerics fp8 runs on bfloat16 activations: load it with dtype bfloat16 "
                                  f"(it is {policy.dtype})")
        c, m = policy.cfg, policy.model
        self.cfg, self.attention = c, attention
        lm, expert = m.language_model, m.expert
        if c.vlm.num_kv_heads != 1:
            raise ValueError("the fast π path folds the query heads over one key head (Gemma 2B / 300M)")
        with torch.no_grad():
            self.vision = FastVisionModel(m.vision)
            lm.layers = nn.ModuleList(FastGemmaLayer(layer, folded=True, fp8=fp8) for layer in lm.layers)
            expert_folded = not c.pi05
            expert_norm = expert.norm
            steps_cond = self._step_conditions(policy)
            if c.pi05:
                self.register_buffer("ada_in", torch.stack([adarms_tables(l.input_layernorm, steps_cond)
                                                            for l in expert.layers], dim=1))
                self.register_buffer("ada_post", torch.stack([adarms_tables(l.post_attention_layernorm, steps_cond)
                                                              for l in expert.layers], dim=1))
                self.register_buffer("ada_final", adarms_tables(expert_norm, steps_cond))
            else:
                self.register_buffer("final_scale", expert_norm.weight.detach().float().clone())
                self._fold_action_time(m, steps_cond)
            expert.layers = nn.ModuleList(FastGemmaLayer(layer, folded=expert_folded, fp8=fp8)
                                          for layer in expert.layers)
            cos, sin = rope_tables(torch.arange(c.prefix_capacity, device=lm.inv_freq.device), lm.inv_freq)
            self.register_buffer("prefix_cos", cos, persistent=False)
            self.register_buffer("prefix_sin", sin, persistent=False)

    @staticmethod
    def _step_conditions(policy) -> Tensor:
        """π0.5: the adaRMS condition of each flow step ``silu(mlp_out(silu(mlp_in(t))))``; π0: the time
        embeddings themselves ``(steps, width)``, in the dtype the reference takes them in."""
        m = policy.model
        if policy.cfg.pi05:
            t = policy.time_embeddings.to(m.action_in_proj.weight.dtype)
            return F.silu(m.time_mlp_out(F.silu(m.time_mlp_in(t.to(m.time_mlp_in.weight.dtype)))))
        return policy.time_embeddings.to(m.action_in_proj.weight.dtype)

    def _fold_action_time(self, m, times: Tensor) -> None:
        """π0: ``mlp_in([a, t])`` with ``a = action_in(x)`` is one product of ``x`` plus a per-step bias."""
        w = m.action_in_proj.weight.shape[0]
        w_in = m.action_time_mlp_in.weight.float()
        w_a, w_t = w_in[:, :w], w_in[:, w:]
        self.register_buffer("action_weight", w_a @ m.action_in_proj.weight.float())
        bias = w_a @ m.action_in_proj.bias.float() + m.action_time_mlp_in.bias.float()
        self.register_buffer("action_bias", times.float() @ w_t.t() + bias[None, :])

    # --- the plan's three parts (same buffers as the exact ones in modeling_pi0.py) ------------------
    def encode(self, policy, observation: dict[str, Tensor], arena: StateArena) -> None:
        """All cameras through the vision tower in one batch, the projector, into ``images``; the state."""
        m = policy.model
        proj = m.paligemma_with_expert.paligemma.model.multi_modal_projector.linear
        images = torch.cat([policy.camera_image(cam, observation) for cam in self.cfg.cameras])
        x = self.vision(images * 2.0 - 1.0, policy.dtype)
        tokens = F.linear(x.reshape(-1, x.shape[-1]).to(proj.weight.dtype), proj.weight, proj.bias)
        arena[policy.IMAGES].copy_(tokens)
        policy.store_state(observation, arena)

    def prefill(self, policy, arena: StateArena) -> None:
        """The language model over the image tokens and the instruction; each layer's KV into the arena."""
        c, lm = self.cfg, policy.model.language_model
        ids, length = policy.language_tokens(arena)
        lang = lm.embed_tokens(ids)
        x = torch.cat([arena[policy.IMAGES], lang * math.sqrt(lang.shape[-1])])
        valid = length + c.image_rows
        P = c.prefix_capacity
        if self.attention == "kernel":
            def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return prefix_attention(q, k, v, valid, suffix_start=P)
        else:
            mask = additive_mask((torch.arange(P, device=x.device) < valid)[None, :], x.dtype)

            def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
                return single_key_head_attention(q, k, v, mask)
        layers = lm.layers
        for i, layer in enumerate(layers):
            k, v = arena[f"{policy.KEY}{i}"], arena[f"{policy.VALUE}{i}"]
            q = layer.project_qkv(x, None, self.prefix_cos, self.prefix_sin, k, v, valid=valid)
            if i + 1 < len(layers):                     # the last layer's output is never used
                x = layer.folded_rest(x, attend(q, k, v))
        arena[policy.PREFIX_LEN].copy_(valid)

    def denoise(self, policy, arena: StateArena, counter: Tensor, guide: Guidance | None = None,
                ahead: Tensor | None = None, steps: int | None = None) -> None:
        """The Euler steps of the expert over the stored prefix (``PI0Policy.denoise``'s function); ``steps``
        fewer than the configured ones only for timing a step (``benchmarks.pi_profile``)."""
        c, m = self.cfg, policy.model
        noise = normal(arena[policy.RNG_SEED], counter, c.chunk_size * c.max_action_dim)
        x = noise.view(c.chunk_size, c.max_action_dim)
        dev, dtype = x.device, policy.dtype
        P, L = c.prefix_capacity, c.suffix_len
        total = P + L if self.attention == "kernel" else -(-(P + L) // ALIGN) * ALIGN
        depth = c.expert.depth
        kv = torch.zeros(2, depth, total, 1, c.expert.head_dim, dtype=dtype, device=dev)
        prefix = [arena[f"{name}{i}"] for name in (policy.KEY, policy.VALUE) for i in range(depth)]
        torch._foreach_copy_([kv[j, i, :P] for j in range(2) for i in range(depth)], prefix)
        prefix_len = arena[policy.PREFIX_LEN]
        if self.attention == "kernel":                # π0's state token (suffix row 0) sees no action
            def attend(q: Tensor, i: int) -> Tensor:
                return prefix_attention(q, kv[0, i], kv[1, i], prefix_len, suffix_start=P, suffix_len=L,
                                        state_rows=0 if c.pi05 else 1)
        else:
            keys = torch.arange(total, device=dev)
            suffix = torch.zeros(L, total, dtype=torch.bool, device=dev)
            suffix[:, P:P + L] = policy.suffix_mask
            allowed = (keys < prefix_len)[None, :] | suffix
            mask = additive_mask(allowed.repeat_interleave(c.expert.num_heads, dim=0), dtype)

            def attend(q: Tensor, i: int) -> Tensor:
                return single_key_head_attention(q, kv[0, i], kv[1, i], mask)
        cos, sin = rope_tables(prefix_len + torch.arange(L, device=dev), m.expert.inv_freq)
        state = None if c.pi05 else m.state_proj(arena[policy.STATE_VEC][None, :].to(m.state_proj.weight.dtype))

        def velocity(x: Tensor, step: int) -> Tensor:
            return self.velocity(policy, x, step, state, kv, attend, cos, sin)
        queue_chunk(integrate_flow(x, steps or c.num_inference_steps, velocity, guide), arena[policy.QUEUE],
                    arena[policy.LEFT], ahead)

    def velocity(self, policy, x: Tensor, step: int, state: Tensor | None, kv: Tensor,
                 attend: Callable[[Tensor, int], Tensor], cos: Tensor, sin: Tensor) -> Tensor:
        c, m = self.cfg, policy.model
        P, L = c.prefix_capacity, c.suffix_len
        dtype = policy.dtype
        layers = m.expert.layers
        eps = c.expert.rms_norm_eps
        if c.pi05:
            h = _linear_rows(x, m.action_in_proj.weight, m.action_in_proj.bias).to(dtype)
            update = gate = None
            for i, layer in enumerate(layers):
                h, normed = ada_residual_norm(h, update, gate, self.ada_in[step, i], eps)
                q = layer.project_qkv(h, normed, cos, sin, kv[0, i, P:P + L], kv[1, i, P:P + L])
                attn = attend(q, i)
                h, normed = ada_residual_norm(h, layer.output(attn), self.ada_in[step, i, 2], self.ada_post[step, i],
                                              eps)
                update, gate = layer.gate_up_down(normed), self.ada_post[step, i, 2]
            _, out = ada_residual_norm(h, update, gate, self.ada_final[step], eps)
        else:
            z = F.silu(_linear_rows(x, self.action_weight, self.action_bias[step]))
            fused = _linear_rows(z, m.action_time_mlp_out.weight, m.action_time_mlp_out.bias)
            h = torch.cat([state.to(fused.dtype), fused]).to(dtype)
            for i, layer in enumerate(layers):
                q = layer.project_qkv(h, None, cos, sin, kv[0, i, P:P + L], kv[1, i, P:P + L])
                h = layer.folded_rest(h, attend(q, i))
            _, out = residual_norm(h[-c.chunk_size:], None, None, self.final_scale, None, eps)
        out = out[-c.chunk_size:]
        return _linear_rows(out, m.action_out_proj.weight, m.action_out_proj.bias).to(torch.float32)


def _linear_rows(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``x W^T + b`` in the weight's dtype (float32 around the expert, as LeRobot keeps it) as a few-row product
    (``ops.rows_matmul``): on a GPU one fused kernel with the bias as a stride-0 residual, where cuBLAS took a
    split-K float32 GEMM of ~18 us for each of these three products a step (H100, 2026-12-07: 0.53 ms a replan,
    ``sgemm_largek``); on the CPU ``addmm``, what ``F.linear`` computes."""
    rows = x.reshape(-1, x.shape[-1]).to(weight.dtype)
    return matmul_rows(rows, weight, residual=bias.expand(rows.shape[0], bias.shape[0]))
