"""GR00T N1.5's action head as LeRobot 0.4.4 saves it: per-embodiment encoders around a flow-matching DiT.

Why a module tree of its own: the names are LeRobot's (``action_head.model.transformer_blocks.<i>.attn1.to_q``,
``action_head.state_encoder.layer1.W``, ``action_head.vl_self_attention...``), so the head's weights load
strictly without diffusers; the forward passes reproduce LeRobot's operation order, so ``exact`` numerics are
bit-identical on the CPU.

Why it is split as it is: of one replan's work, only the noisy actions change between the flow steps. The
backbone features are conditioned once (``condition``: LayerNorm, the self-attention blocks, and the keys and
values every cross-attention block reads), the state is embedded once (``embed_state``), and the time tables of
the fixed flow times (``time_tables``: the timestep embedding, each block's AdaLN scale and shift, the output's)
do not depend on the inputs at all; ``velocity`` is then one flow step. Computing those once gives the same bits
as LeRobot computing them every step: the same operations on the same inputs.

The flow: noise at t = 0, ``num_inference_timesteps`` Euler steps of ``dt = 1 / N`` at the discretised times
``int(i / N * num_timestep_buckets)``; the DiT sees ``[state token, future tokens, action tokens]`` and the
velocity is the decoder's output at the action tokens. Cross-attention (even blocks when
``interleave_self_attention``) attends to every backbone token, padding included, as LeRobot does.

Why ``key_mask``: LeRobot (and ``exact``) give the head only the prompt's rows, so every key is a real token. The
``fast`` numerics give it a fixed number of rows (the prompt buffer's capacity, zero past the prompt) so that
no shape depends on the prompt; ``key_mask`` (B, 1, 1, rows), True at the prompt's rows, then keeps the padding
out of the VL self-attention's keys and every cross-attention block's keys, which makes the function the
unpadded one again (padded query rows of the VL self-attention are computed and never read). ``None`` (exact):
SDPA without a mask, LeRobot's call.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class DiTSizes:
    """A diffusers-style transformer's sizes (``diffusion_model_cfg`` / ``vl_self_attention_cfg``)."""

    heads: int = 32
    head_dim: int = 48
    layers: int = 16
    cross_attention_dim: int | None = 2048        # the DiT's; None for the VL self-attention
    interleave_self_attention: bool = True        # odd blocks attend to themselves
    output_dim: int = 1024                        # the DiT's proj_out_2

    @property
    def width(self) -> int:
        return self.heads * self.head_dim


@dataclass(frozen=True)
class HeadSizes:
    """``action_head_cfg`` of a GR00T N1.5 checkpoint; the defaults are GR00T-N1.5-3B's."""

    action_dim: int = 32
    action_horizon: int = 16
    max_state_dim: int = 64
    hidden_size: int = 1024
    input_embedding_dim: int = 1536
    backbone_embedding_dim: int = 2048
    max_num_embodiments: int = 32
    num_target_vision_tokens: int = 32
    max_seq_len: int = 1024
    num_inference_timesteps: int = 4
    num_timestep_buckets: int = 1000
    add_pos_embed: bool = True
    use_vlln: bool = True
    dit: DiTSizes = DiTSizes()
    vl_self_attention: DiTSizes = DiTSizes(heads=32, head_dim=64, layers=4, cross_attention_dim=None,
                                           interleave_self_attention=False, output_dim=0)

    def flow_times(self) -> list[int]:
        """The discretised time of each Euler step, LeRobot's ``int(t / N * buckets)`` (0, 250, 500, 750)."""
        n = self.num_inference_timesteps
        return [int(i / float(n) * self.num_timestep_buckets) for i in range(n)]


# --- per-embodiment layers ------------------------------------------------------------------------------------
class CategorySpecificLinear(nn.Module):
    """One weight matrix per embodiment: ``x @ W[e] + b[e]``."""

    def __init__(self, categories: int, d_in: int, d_out: int) -> None:
        super().__init__()
        self.W = nn.Parameter(torch.empty(categories, d_in, d_out))
        self.b = nn.Parameter(torch.empty(categories, d_out))

    def forward(self, x: Tensor, embodiment: Tensor) -> Tensor:
        return torch.bmm(x, self.W[embodiment]) + self.b[embodiment].unsqueeze(1)


class CategorySpecificMLP(nn.Module):
    def __init__(self, categories: int, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.layer1 = CategorySpecificLinear(categories, d_in, hidden)
        self.layer2 = CategorySpecificLinear(categories, hidden, d_out)

    def forward(self, x: Tensor, embodiment: Tensor) -> Tensor:
        return self.layer2(F.relu(self.layer1(x, embodiment)), embodiment)


def sinusoid(times: Tensor, width: int) -> Tensor:
    """The action encoder's time code ``[sin | cos]`` of ``times`` (B, T), LeRobot's float32 arithmetic."""
    half = width // 2
    exponent = -torch.arange(half, dtype=torch.float, device=times.device) * (torch.log(torch.tensor(10000.0)) / half)
    freqs = times.float().unsqueeze(-1) * exponent.exp()
    return torch.cat([torch.sin(freqs), torch.cos(freqs)], dim=-1)


class MultiEmbodimentActionEncoder(nn.Module):
    """Noisy actions and their flow time to tokens: ``W3(swish(W2([W1(a) | sinusoid(t)])))``."""

    def __init__(self, action_dim: int, width: int, categories: int) -> None:
        super().__init__()
        self.width = width
        self.W1 = CategorySpecificLinear(categories, action_dim, width)
        self.W2 = CategorySpecificLinear(categories, 2 * width, width)
        self.W3 = CategorySpecificLinear(categories, width, width)

    def forward(self, actions: Tensor, time_code: Tensor, embodiment: Tensor) -> Tensor:
        """``time_code``: ``sinusoid`` of the step's time, (B, T, width)."""
        a = self.W1(actions, embodiment)
        x = torch.cat([a, time_code.to(dtype=a.dtype)], dim=-1)
        x = self.W2(x, embodiment)
        return self.W3(x * torch.sigmoid(x), embodiment)


# --- the transformer blocks (diffusers' names) -----------------------------------------------------------------
class Attention(nn.Module):
    """diffusers' ``Attention`` with its default processor (SDPA, no mask, biases on)."""

    def __init__(self, width: int, heads: int, head_dim: int, kv_dim: int | None) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(width, heads * head_dim)
        self.to_k = nn.Linear(kv_dim or width, heads * head_dim)
        self.to_v = nn.Linear(kv_dim or width, heads * head_dim)
        self.to_out = nn.ModuleList([nn.Linear(heads * head_dim, width), nn.Identity()])

    def keys_values(self, source: Tensor) -> tuple[Tensor, Tensor]:
        b = source.shape[0]
        k, v = self.to_k(source), self.to_v(source)
        head_dim = k.shape[-1] // self.heads
        return (k.view(b, -1, self.heads, head_dim).transpose(1, 2),
                v.view(b, -1, self.heads, head_dim).transpose(1, 2))

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor] | None = None, key_mask: Tensor | None = None) -> Tensor:
        """Self-attention, or cross-attention to keys and values made by ``keys_values``; ``key_mask``
        (B, 1, 1, keys), True at the keys that take part (module doc), or None: every key."""
        b = x.shape[0]
        q = self.to_q(x)
        k, v = kv if kv is not None else self.keys_values(x)
        q = q.view(b, -1, self.heads, k.shape[-1]).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(b, -1, self.heads * k.shape[-1]).to(q.dtype)
        return self.to_out[0](out)


class GeluProj(nn.Module):
    def __init__(self, width: int, inner: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, inner)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """diffusers' ``FeedForward`` with ``gelu-approximate``, 4x wide (``net.0.proj``, ``net.2``)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.ModuleList([GeluProj(width, 4 * width), nn.Identity(), nn.Linear(4 * width, width)])

    def forward(self, x: Tensor) -> Tensor:
        return self.net[2](self.net[0](x))


class AdaNorm(nn.Module):
    """AdaLayerNorm's weights (``norm1.linear``): the scale and shift come from ``time_tables``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, 2 * width)


class Block(nn.Module):
    """diffusers' ``BasicTransformerBlock`` as GR00T configures it: norm, attention, residual, norm, FF, residual.

    ``ada``: the DiT's AdaLayerNorm (no affine, eps 1e-5) conditioned on the flow time; else the VL
    self-attention's affine LayerNorms."""

    def __init__(self, width: int, heads: int, head_dim: int, kv_dim: int | None, ada: bool) -> None:
        super().__init__()
        self.ada = ada
        self.norm1 = AdaNorm(width) if ada else nn.LayerNorm(width, eps=1e-5)
        self.attn1 = Attention(width, heads, head_dim, kv_dim)
        self.norm3 = nn.LayerNorm(width, eps=1e-5, elementwise_affine=not ada)
        self.ff = FeedForward(width)
        self.width = width

    def forward(self, x: Tensor, kv: tuple[Tensor, Tensor] | None = None,
                scale_shift: tuple[Tensor, Tensor] | None = None, key_mask: Tensor | None = None) -> Tensor:
        if self.ada:
            one_plus_scale, shift = scale_shift
            h = F.layer_norm(x, (self.width,), eps=1e-5) * one_plus_scale + shift
        else:
            h = self.norm1(x)
        x = self.attn1(h, kv, key_mask) + x
        return self.ff(self.norm3(x)) + x


class TimestepEmbedder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(256, width)
        self.linear_2 = nn.Linear(width, width)


class TimestepEncoder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.timestep_embedder = TimestepEmbedder(width)

    def forward(self, times: Tensor) -> Tensor:
        """diffusers' ``Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=1)`` and ``TimestepEmbedding``."""
        half = 128
        exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=times.device)
        exponent = exponent / (half - 1)
        emb = times[:, None].float() * torch.exp(exponent)[None, :]
        emb = 1 * emb
        emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
        e = self.timestep_embedder
        emb = emb.to(e.linear_1.weight.dtype)
        return e.linear_2(F.silu(e.linear_1(emb)))


class DiT(nn.Module):
    def __init__(self, s: DiTSizes) -> None:
        super().__init__()
        self.sizes = s
        self.timestep_encoder = TimestepEncoder(s.width)
        self.transformer_blocks = nn.ModuleList(
            Block(s.width, s.heads, s.head_dim, None if self.self_attending(i) else s.cross_attention_dim, ada=True)
            for i in range(s.layers))
        self.proj_out_1 = nn.Linear(s.width, 2 * s.width)
        self.proj_out_2 = nn.Linear(s.width, s.output_dim)

    def self_attending(self, i: int) -> bool:
        return self.sizes.interleave_self_attention and i % 2 == 1


class SelfAttentionTransformer(nn.Module):
    def __init__(self, s: DiTSizes) -> None:
        super().__init__()
        self.transformer_blocks = nn.ModuleList(Block(s.width, s.heads, s.head_dim, None, ada=False)
                                                for _ in range(s.layers))

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        for block in self.transformer_blocks:
            x = block(x, key_mask=key_mask)
        return x


@dataclass
class TimeTables:
    """What one flow step's time fixes, per step: the action encoder's time code, each DiT block's
    ``(1 + scale, shift)``, and the output norm's ``(1 + scale, shift)``, broadcast over tokens.

    Made for one batch size: a GEMM of another row count may round differently, so tables made for batch 1
    and broadcast to 3 would not be LeRobot's bits at batch 3."""

    batch: int
    time_code: list[Tensor]                               # (B, horizon, width) per step
    blocks: list[list[tuple[Tensor, Tensor]]]             # [step][block] -> (1 + scale, shift), (B, 1, width)
    output: list[tuple[Tensor, Tensor]]                   # [step] -> (1 + scale, shift)


class FlowmatchingActionHead(nn.Module):
    """The head's weights under LeRobot's names, and its forward passes split as the engine runs them."""

    def __init__(self, s: HeadSizes) -> None:
        super().__init__()
        self.sizes = s
        categories = s.max_num_embodiments
        self.model = DiT(s.dit)
        self.state_encoder = CategorySpecificMLP(categories, s.max_state_dim, s.hidden_size, s.input_embedding_dim)
        self.action_encoder = MultiEmbodimentActionEncoder(s.action_dim, s.input_embedding_dim, categories)
        self.action_decoder = CategorySpecificMLP(categories, s.hidden_size, s.hidden_size, s.action_dim)
        self.future_tokens = nn.Embedding(s.num_target_vision_tokens, s.input_embedding_dim)
        self.vlln = nn.LayerNorm(s.backbone_embedding_dim) if s.use_vlln else nn.Identity()
        self.vl_self_attention = SelfAttentionTransformer(s.vl_self_attention) if s.use_vlln else nn.Identity()
        if s.add_pos_embed:
            self.position_embedding = nn.Embedding(s.max_seq_len, s.input_embedding_dim)

    # --- once per replan ----------------------------------------------------------------------------------
    def condition(self, backbone_features: Tensor,
                  key_mask: Tensor | None = None) -> list[tuple[Tensor, Tensor] | None]:
        """Keys and values of the conditioned backbone features for each cross-attention block (None for a
        self-attention block); ``key_mask``: the backbone rows the VL self-attention's keys take (module doc)."""
        vl = self.vlln(backbone_features)
        vl = self.vl_self_attention(vl, key_mask) if self.sizes.use_vlln else self.vl_self_attention(vl)
        return [None if self.model.self_attending(i) else block.attn1.keys_values(vl)
                for i, block in enumerate(self.model.transformer_blocks)]

    def embed_state(self, state: Tensor, embodiment: Tensor) -> Tensor:
        """The state token (B, 1, width) from the padded, normalised state (B, 1, max_state_dim)."""
        return self.state_encoder(state, embodiment)

    # --- once per model ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def time_tables(self, batch: int = 1) -> TimeTables:
        s, dit = self.sizes, self.model
        device = dit.proj_out_1.weight.device
        codes, blocks, output = [], [], []
        for t in s.flow_times():
            times = torch.full((batch,), t, device=device)
            codes.append(sinusoid(times.unsqueeze(1).expand(-1, s.action_horizon), s.input_embedding_dim))
            temb = dit.timestep_encoder(times)
            per_block = []
            for block in dit.transformer_blocks:
                scale, shift = block.norm1.linear(F.silu(temb)).chunk(2, dim=1)
                per_block.append(((1 + scale[:, None]), shift[:, None]))
            blocks.append(per_block)
            shift, scale = dit.proj_out_1(F.silu(temb)).chunk(2, dim=1)
            output.append(((1 + scale[:, None]), shift[:, None]))
        return TimeTables(batch, codes, blocks, output)

    # --- once per flow step -------------------------------------------------------------------------------------
    def velocity(self, actions: Tensor, step: int, state_token: Tensor, kv: list[tuple[Tensor, Tensor] | None],
                 embodiment: Tensor, tables: TimeTables, key_mask: Tensor | None = None) -> Tensor:
        """The predicted velocity (B, horizon, action_dim) of the noisy ``actions`` at flow step ``step``;
        ``key_mask``: the backbone rows the cross-attention blocks attend to (None: all)."""
        s, b = self.sizes, actions.shape[0]
        if tables.batch != b:
            raise ValueError(f"time tables made for batch {tables.batch}, actions of batch {b}")
        tokens = self.action_encoder(actions, tables.time_code[step], embodiment)
        if s.add_pos_embed:
            tokens = tokens + self.position_embedding.weight[:s.action_horizon].unsqueeze(0)
        future = self.future_tokens.weight.unsqueeze(0).expand(b, -1, -1)
        x = torch.cat((state_token, future, tokens), dim=1)
        for block, block_kv, scale_shift in zip(self.model.transformer_blocks, kv, tables.blocks[step]):
            x = block(x, block_kv, scale_shift, None if block_kv is None else key_mask)
        one_plus_scale, shift = tables.output[step]
        x = F.layer_norm(x, (x.shape[-1],), eps=1e-6) * one_plus_scale + shift
        pred = self.action_decoder(self.model.proj_out_2(x), embodiment)
        return pred[:, -s.action_horizon:]

    def sample(self, backbone_features: Tensor, state: Tensor, embodiment: Tensor, noise: Tensor,
               tables: TimeTables | None = None, key_mask: Tensor | None = None,
               correct: Callable[[Tensor, float, Tensor], Tensor] | None = None) -> Tensor:
        """One whole chunk (B, horizon, action_dim): LeRobot's ``get_action`` with ``noise`` as its draw;
        ``key_mask`` (B, 1, 1, rows): the valid backbone rows (padded features, module doc), None: all rows;
        ``correct(actions, t, v)``: each step's velocity replaced before the Euler step (``t``: LeRobot's
        ``t_cont``, ``step / N``; Real-Time Chunking's guidance), None: as LeRobot."""
        tables = tables or self.time_tables(noise.shape[0])
        kv = self.condition(backbone_features, key_mask)
        state_token = self.embed_state(state, embodiment)
        n = self.sizes.num_inference_timesteps
        actions, dt = noise, 1.0 / n
        for step in range(n):
            v = self.velocity(actions, step, state_token, kv, embodiment, tables, key_mask)
            if correct is not None:
                v = correct(actions, step / float(n), v)
            actions = actions + dt * v
        return actions
