"""ACT (Action Chunking Transformer) from a LeRobot checkpoint, with its episode state in the arena.

Why our own model code: LeRobot keeps ACT's between-call state in Python (a
``deque`` of actions, or the temporal ensembler's tensors rebound every call),
so a capsule could not capture it and a restore would leak a stale chunk into
the resumed episode (lerobot#1116). Here the network is LeRobot's ACT written
with the same module and parameter names (its ``model.safetensors`` loads
strictly, VAE encoder included though inference never runs it), and the action
queue or the temporal-ensembling accumulator with its counts are arena buffers
updated in place. With a queue, the engine decides on the host whether a step
replans (runs the network, refills the queue) or only pops (``action_queue``);
temporal ensembling runs the network every step by definition.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from flashrt_ros.models.lerobot.act.configuration_act import ACTConfig
from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, feature_specs
from flashrt_ros.models.lerobot.layout import lay_out_convs
from flashrt_ros.models.lerobot.normalize import PolicyNormalization
from flashrt_ros.models.lerobot.resnet import ResNetTrunk
from flashrt_ros.models.policy_interface import ActionQueue, Guidance, PolicyModule, pop_queue
from flashrt_ros.models.policy_features import ENV_STATE, STATE, FeatureSpec
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


# --- transformer ----------------------------------------------------------------

class MultiheadAttention(nn.Module):
    """``nn.MultiheadAttention``'s parameters (``in_proj_weight``, ``out_proj``) on sequence-first inputs."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        # nn.MultiheadAttention's initial values (a checkpoint overwrites them; never uninitialised memory)
        self.in_proj_weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(3 * dim, dim)))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """``(L, B, D)`` queries over ``(S, B, D)`` keys/values -> ``(L, B, D)``."""
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        L, B, D = query.shape
        h, hd = self.n_heads, D // self.n_heads

        def heads(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
            return F.linear(x, w, b).view(x.shape[0], B * h, hd).transpose(0, 1)   # (B*h, len, hd)

        q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(y.transpose(0, 1).reshape(L, B, D))


def _activation(name: str):
    try:
        return {"relu": F.relu, "gelu": F.gelu, "glu": F.glu}[name]
    except KeyError:
        raise InvalidArgument(f"feedforward_activation {name!r}: use relu, gelu or glu") from None


class EncoderLayer(nn.Module):
    def __init__(self, c: ACTConfig) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(c.dim_model, c.n_heads)
        self.linear1 = nn.Linear(c.dim_model, c.dim_feedforward)
        self.linear2 = nn.Linear(c.dim_feedforward, c.dim_model)
        self.norm1, self.norm2 = nn.LayerNorm(c.dim_model), nn.LayerNorm(c.dim_model)
        self.activation = _activation(c.feedforward_activation)
        self.pre_norm = c.pre_norm

    def forward(self, x: Tensor, pos: Tensor) -> Tensor:
        skip = x
        if self.pre_norm:
            x = self.norm1(x)
        qk = x + pos
        x = skip + self.self_attn(qk, qk, x)
        if self.pre_norm:
            skip, x = x, self.norm2(x)
        else:
            x = self.norm1(x)
            skip = x
        x = skip + self.linear2(self.activation(self.linear1(x)))
        return x if self.pre_norm else self.norm2(x)


class Encoder(nn.Module):
    def __init__(self, c: ACTConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(n_layers))
        self.norm = nn.LayerNorm(c.dim_model) if c.pre_norm else nn.Identity()

    def forward(self, x: Tensor, pos: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, pos)
        return self.norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, c: ACTConfig) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(c.dim_model, c.n_heads)
        self.multihead_attn = MultiheadAttention(c.dim_model, c.n_heads)
        self.linear1 = nn.Linear(c.dim_model, c.dim_feedforward)
        self.linear2 = nn.Linear(c.dim_feedforward, c.dim_model)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(c.dim_model) for _ in range(3))
        self.activation = _activation(c.feedforward_activation)
        self.pre_norm = c.pre_norm

    def forward(self, x: Tensor, memory: Tensor, dec_pos: Tensor, enc_pos: Tensor) -> Tensor:
        skip = x
        if self.pre_norm:
            x = self.norm1(x)
        q = x + dec_pos
        x = skip + self.self_attn(q, q, x)
        if self.pre_norm:
            skip, x = x, self.norm2(x)
        else:
            x = self.norm1(x)
            skip = x
        x = skip + self.multihead_attn(x + dec_pos, memory + enc_pos, memory)
        if self.pre_norm:
            skip, x = x, self.norm3(x)
        else:
            x = self.norm2(x)
            skip = x
        x = skip + self.linear2(self.activation(self.linear1(x)))
        return x if self.pre_norm else self.norm3(x)


class Decoder(nn.Module):
    def __init__(self, c: ACTConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.n_decoder_layers))
        self.norm = nn.LayerNorm(c.dim_model)

    def forward(self, x: Tensor, memory: Tensor, dec_pos: Tensor, enc_pos: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, dec_pos, enc_pos)
        return self.norm(x)


def sinusoidal_2d(h: int, w: int, dim: int, device: torch.device) -> Tensor:
    """DETR-style 2-D sine position embedding ``(dim * 2, h, w)`` as ACT computes it (positions 1..n over n)."""
    eps, two_pi = 1e-6, 2 * math.pi
    y = torch.arange(1, h + 1, dtype=torch.float32, device=device).view(h, 1).expand(h, w)
    x = torch.arange(1, w + 1, dtype=torch.float32, device=device).view(1, w).expand(h, w)
    y = y / (h + eps) * two_pi
    x = x / (w + eps) * two_pi
    inv = 10000 ** (2 * (torch.arange(dim, dtype=torch.float32, device=device) // 2) / dim)
    x, y = x.unsqueeze(-1) / inv, y.unsqueeze(-1) / inv
    px = torch.stack((x[..., 0::2].sin(), x[..., 1::2].cos()), dim=-1).flatten(2)
    py = torch.stack((y[..., 0::2].sin(), y[..., 1::2].cos()), dim=-1).flatten(2)
    return torch.cat((py, px), dim=2).permute(2, 0, 1)


class ACTNet(nn.Module):
    """LeRobot's ``ACT`` module tree (same names), inference path only: observations -> a normalised chunk."""

    def __init__(self, c: ACTConfig) -> None:
        super().__init__()
        self.c = c
        d = c.dim_model
        if c.use_vae:       # training-only, loaded so that the checkpoint's weights match strictly
            self.vae_encoder = Encoder(c, c.n_vae_encoder_layers)
            self.vae_encoder_cls_embed = nn.Embedding(1, d)
            if c.state_dim:
                self.vae_encoder_robot_state_input_proj = nn.Linear(c.state_dim, d)
            self.vae_encoder_action_input_proj = nn.Linear(c.action_dim, d)
            self.vae_encoder_latent_output_proj = nn.Linear(d, 2 * c.latent_dim)
            n_tokens = 1 + c.chunk_size + (1 if c.state_dim else 0)
            self.register_buffer("vae_encoder_pos_enc", torch.zeros(1, n_tokens, d))
        if c.cameras:
            self.backbone = ResNetTrunk(c.vision_backbone)
            self.encoder_img_feat_input_proj = nn.Conv2d(ResNetTrunk.out_channels, d, 1)
        self.encoder = Encoder(c, c.n_encoder_layers)
        self.decoder = Decoder(c)
        if c.state_dim:
            self.encoder_robot_state_input_proj = nn.Linear(c.state_dim, d)
        if c.env_state_dim:
            self.encoder_env_state_input_proj = nn.Linear(c.env_state_dim, d)
        self.encoder_latent_input_proj = nn.Linear(c.latent_dim, d)
        self.encoder_1d_feature_pos_embed = nn.Embedding(1 + bool(c.state_dim) + bool(c.env_state_dim), d)
        self.decoder_pos_embed = nn.Embedding(c.chunk_size, d)
        self.action_head = nn.Linear(d, c.action_dim)

    def forward(self, state: Tensor | None, env_state: Tensor | None, images: list[Tensor]) -> Tensor:
        """Normalised inputs (batch 1) -> normalised actions ``(chunk_size, action_dim)``."""
        c, p = self.c, self.encoder_latent_input_proj.weight
        latent = torch.zeros(1, c.latent_dim, dtype=p.dtype, device=p.device)
        tokens = [self.encoder_latent_input_proj(latent)]
        if state is not None:
            tokens.append(self.encoder_robot_state_input_proj(state))
        if env_state is not None:
            tokens.append(self.encoder_env_state_input_proj(env_state))
        pos = [self.encoder_1d_feature_pos_embed.weight.unsqueeze(1)]
        seq = [torch.stack(tokens)]                                           # (n1d, 1, D)
        for img in images:
            feat = self.backbone(img)                                         # (1, 512, h, w)
            cam_pos = sinusoidal_2d(feat.shape[2], feat.shape[3], c.dim_model // 2, feat.device).to(feat.dtype)
            feat = self.encoder_img_feat_input_proj(feat)
            seq.append(feat.flatten(2).permute(2, 0, 1))                      # (h*w, 1, D)
            pos.append(cam_pos.flatten(1).transpose(0, 1).unsqueeze(1))
        x, enc_pos = torch.cat(seq), torch.cat(pos)
        memory = self.encoder(x, enc_pos)
        queries = torch.zeros(c.chunk_size, 1, c.dim_model, dtype=x.dtype, device=x.device)
        out = self.decoder(queries, memory, self.decoder_pos_embed.weight.unsqueeze(1), enc_pos)
        return self.action_head(out[:, 0])


class ACTPolicy(PolicyModule):
    """A LeRobot ACT checkpoint as a ``PolicyModule``: normalise, plan, queue or ensemble, unnormalise.

    State (arena): without temporal ensembling the queue of ``n_action_steps``
    normalised actions and how many are left; with it, the running weighted
    means of the ``chunk_size - 1`` future steps, how many chunks each has
    averaged, and whether the episode has started.
    """

    QUEUE = "policy.act.queue"
    LEFT = "policy.act.queue_left"
    ENSEMBLE = "policy.act.ensemble"
    COUNT = "policy.act.ensemble_count"
    STARTED = "policy.act.ensemble_started"

    def __init__(self, cfg: ACTConfig, ckpt: LeRobotCheckpoint | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.state_dim, cfg.action_dim
        self.model = ACTNet(cfg)
        self.norm = PolicyNormalization(ckpt)
        self.lay_out_weights = True     # False: keep torch's default layout (the profile's ablation)
        if cfg.temporal_ensemble_coeff is not None:
            w = torch.exp(-cfg.temporal_ensemble_coeff * torch.arange(cfg.chunk_size))
            self.register_buffer("ensemble_weights", w, persistent=False)
            self.register_buffer("ensemble_weights_cumsum", torch.cumsum(w, dim=0), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        """``.to()`` and friends, then the trunk's conv weights laid out for the new device (``layout``):
        channels-last on CUDA took a bf16 replan from 1.71 to 1.50 ms (H200)."""
        super()._apply(fn, recurse)
        if self.lay_out_weights:
            lay_out_convs(self.model, conv2d=True)
        return self

    @property
    def ensembling(self) -> bool:
        return self.cfg.temporal_ensemble_coeff is not None

    def input_features(self) -> dict[str, FeatureSpec]:
        return feature_specs(self.cfg)

    def config(self) -> dict:
        c = self.cfg
        return {"type": "act", **{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(c).items()}}

    def state_specs(self) -> list[BufferSpec]:
        c = self.cfg
        if self.ensembling:
            n = c.chunk_size - 1
            return [BufferSpec(self.ENSEMBLE, (n, c.action_dim), torch.float32, group="policy",
                               doc="temporal ensemble: running weighted mean of each future step's actions"),
                    BufferSpec(self.COUNT, (n,), torch.int64, group="policy",
                               doc="temporal ensemble: chunks averaged into each future step"),
                    BufferSpec(self.STARTED, (), torch.int64, group="policy",
                               doc="1 once the episode's first chunk is in the ensemble")]
        return [BufferSpec(self.QUEUE, (c.n_action_steps, c.action_dim), torch.float32, group="policy",
                           doc="action queue: the current chunk's first n_action_steps (normalised)"),
                BufferSpec(self.LEFT, (), torch.int64, group="policy", doc="actions left in the queue")]

    def predict_chunk(self, observation: Mapping[str, Tensor]) -> Tensor:
        """Normalised actions ``(chunk_size, action_dim)`` for one observation (no state touched)."""
        c = self.cfg
        dtype = self.model.action_head.weight.dtype
        def prep(name: str) -> Tensor:
            return self.norm.input(name, observation[name].unsqueeze(0)).to(dtype)
        state = prep(STATE) if c.state_dim else None
        env = prep(ENV_STATE) if c.env_state_dim else None
        return self.model(state, env, [prep(cam) for cam in c.cameras])

    def action_queue(self) -> ActionQueue | None:
        c = self.cfg
        return None if self.ensembling else ActionQueue(self.LEFT, c.n_action_steps, pop_reads_observation=False,
                                                        chunk=self.QUEUE, chunk_size=c.chunk_size,
                                                        ahead=c.chunk_size - c.n_action_steps)

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide: Guidance | None = None,
             ahead: Tensor | None = None) -> None:
        """A new chunk into the queue from one observation (asynchronous replanning; no pop)."""
        if guide is not None:
            raise InvalidArgument("ACT predicts its chunk in one pass: Real-Time Chunking needs a flow-matching "
                                  "policy (use replan async)")
        chunk = self.predict_chunk(observation).to(torch.float32)
        self._refill(chunk, arena)
        if ahead is not None:
            n = self.cfg.n_action_steps
            ahead.copy_(chunk[n:n + ahead.shape[0]])

    def step_observation(self, observation: Mapping[str, Tensor], arena: StateArena,
                         replan: bool | None = None) -> Tensor:
        if self.ensembling:
            action = self._ensemble(self.predict_chunk(observation).to(torch.float32), arena)
        else:
            if replan is None:
                raise InvalidArgument("ACT with an action queue: the caller decides replan (see action_queue)")
            if replan:
                self._refill(self.predict_chunk(observation).to(torch.float32), arena)
            action = pop_queue(arena[self.QUEUE], arena[self.LEFT])
        return self.norm.action(action)

    def _refill(self, chunk: Tensor, arena: StateArena) -> None:
        n = self.cfg.n_action_steps
        arena[self.QUEUE].copy_(chunk[:n])
        arena[self.LEFT].fill_(n)

    def _ensemble(self, chunk: Tensor, arena: StateArena) -> Tensor:
        """LeRobot's ``ACTTemporalEnsembler.update`` on fixed-shape buffers (same arithmetic order)."""
        ens, count, started = arena[self.ENSEMBLE], arena[self.COUNT], arena[self.STARTED]
        w, wsum = self.ensemble_weights, self.ensemble_weights_cumsum
        prev = count.clamp_min(1)
        updated = (ens * wsum[prev - 1].unsqueeze(1) + chunk[:-1] * w[count].unsqueeze(1)) / wsum[count].unsqueeze(1)
        merged = torch.where(started.bool(), updated, chunk[:-1])
        counts = torch.where(started.bool(), (count + 1).clamp_max(self.cfg.chunk_size), torch.ones_like(count))
        full = torch.cat([merged, chunk[-1:]])
        full_count = torch.cat([counts, torch.ones_like(counts[:1])])
        ens.copy_(full[1:])
        count.copy_(full_count[1:])
        started.fill_(1)
        return full[0]

