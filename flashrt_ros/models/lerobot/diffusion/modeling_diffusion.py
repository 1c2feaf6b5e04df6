"""Diffusion Policy (1-D conditional UNet, DDPM / DDIM) from a LeRobot checkpoint, state in the arena.

Why our own model code: LeRobot keeps the observation history (``n_obs_steps``)
and the action queue in Python deques and draws its noise from torch's global
RNG, so two seed-equal episodes differ and a capsule could not bring an episode
back. Here the module tree and parameter names are LeRobot's (its
``model.safetensors`` loads strictly); the observation history, the action
queue and the noise stream (a counter-based RNG seeded per episode) are arena
buffers, and the whole denoising loop is unrolled with fixed scheduler
coefficients, so a replanning step (encode, denoise K times, refill the queue)
is one CUDA graph and a pop (history update, queue pop) another; the engine
chooses between them on the host (``action_queue``).

The configuration is ``configuration_diffusion.py``, the network (image encoder,
UNet, its speed at batch 1) ``diffusion_net.py``; this module is the policy: its
arena state and the denoising loop.

Noise stream: plan number ``p`` of an episode (the ``p``-th time the queue was
refilled) draws the initial sample with counter ``c = p * (K + 1)`` and the
DDPM variance noise of reverse step ``j`` with counter ``c + 1 + j``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from flashrt_ros.models.lerobot.checkpoint import LeRobotCheckpoint, feature_specs
from flashrt_ros.models.lerobot.diffusion.configuration_diffusion import DiffusionConfig
from flashrt_ros.models.lerobot.diffusion.diffusion_net import DiffusionNet
from flashrt_ros.models.lerobot.diffusion.schedulers import reverse_step, reverse_steps
from flashrt_ros.models.lerobot.layout import lay_out_convs
from flashrt_ros.models.lerobot.normalize import PolicyNormalization
from flashrt_ros.models.policy_interface import RNG_PLANS, RNG_SEED, ActionQueue, Guidance, PolicyModule, pop_queue
from flashrt_ros.models.policy_features import ENV_STATE, STATE, FeatureSpec
from flashrt_ros.ops.counter_rng import normal
from flashrt_ros.runtime.arena import BufferSpec, StateArena
from flashrt_ros.runtime.errors import InvalidArgument


class DiffusionPolicy(PolicyModule):
    """A LeRobot Diffusion Policy checkpoint as a ``PolicyModule``.

    State (arena): the last ``n_obs_steps`` normalised observations of each
    input, whether the history has been filled, the action queue and how many
    actions are left, the noise seed and the count of chunks planned.
    """

    HIST_PREFIX = "policy.diffusion.history."
    STARTED = "policy.diffusion.history_started"
    QUEUE = "policy.diffusion.queue"
    LEFT = "policy.diffusion.queue_left"
    RNG_SEED = RNG_SEED
    PLANS = RNG_PLANS
    NOISE = "noise.diffusion"     # input feature after ``noise_from_input()``: a plan's draws, flattened

    def __init__(self, cfg: DiffusionConfig, ckpt: LeRobotCheckpoint | None = None) -> None:
        super().__init__()
        if cfg.n_action_steps > cfg.horizon - cfg.n_obs_steps + 1:
            raise InvalidArgument("n_action_steps must be <= horizon - n_obs_steps + 1")
        if cfg.horizon % (2 ** len(cfg.down_dims)) != 0:
            raise InvalidArgument("horizon must be a multiple of 2 ** len(down_dims)")
        self.cfg = cfg
        self.obs_dim, self.act_dim = cfg.state_dim, cfg.action_dim
        self.diffusion = DiffusionNet(cfg)
        self.steps = reverse_steps(cfg.noise_scheduler_type, num_train_timesteps=cfg.num_train_timesteps,
                                   num_inference_steps=cfg.inference_steps, beta_schedule=cfg.beta_schedule,
                                   beta_start=cfg.beta_start, beta_end=cfg.beta_end)
        self.register_buffer("timesteps", torch.tensor([s.timestep for s in self.steps]), persistent=False)
        self.norm = PolicyNormalization(ckpt)
        self.noise_input = False
        self.lay_out_weights = True     # False: keep torch's default layout (the profile's ablation)

    def _apply(self, fn, recurse: bool = True):
        """``.to()`` and friends, then the UNet's conv weights laid out for the new device (``layout``)."""
        super()._apply(fn, recurse)
        if self.lay_out_weights:
            lay_out_convs(self.diffusion.unet, conv1d=True)
        return self

    def noise_from_input(self) -> DiffusionPolicy:
        """Take each plan's noise from the observation instead of the counter RNG (call before building the engine).

        Why: parity with another implementation (LeRobot draws from torch's global
        RNG). The observation then carries ``NOISE``: ``(K + 1) * horizon * A``
        values, row 0 the initial sample and row ``1 + j`` the DDPM variance noise
        of reverse step ``j`` (unused where that step adds none), read on
        replanning steps only. The noise is an input, not state: replaying an
        episode from a capsule needs the same inputs, as with any observation.
        """
        self.noise_input = True
        return self

    def noise_shape(self) -> tuple[int, int, int]:
        """``(K + 1, horizon, action_dim)``: the draws of one plan."""
        return len(self.steps) + 1, self.cfg.horizon, self.cfg.action_dim

    # --- contract -------------------------------------------------------------------
    def input_features(self) -> dict[str, FeatureSpec]:
        features = feature_specs(self.cfg)
        if self.noise_input:
            features[self.NOISE] = FeatureSpec((math.prod(self.noise_shape()),), "state")
        return features

    def config(self) -> dict:
        return {"type": "diffusion", **{k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.cfg).items()}}

    def _histories(self) -> dict[str, tuple[int, ...]]:
        c = self.cfg
        out = {"state": (c.n_obs_steps, c.state_dim)}
        if c.cameras:
            out["images"] = (c.n_obs_steps, len(c.cameras), *c.image_shape)
        if c.env_state_dim:
            out["env"] = (c.n_obs_steps, c.env_state_dim)
        return out

    def state_specs(self) -> list[BufferSpec]:
        c = self.cfg
        specs = [BufferSpec(self.HIST_PREFIX + k, shape, torch.float32, group="policy",
                            doc=f"last n_obs_steps normalised {k} observations, oldest first")
                 for k, shape in self._histories().items()]
        return specs + [
            BufferSpec(self.STARTED, (), torch.int64, group="policy", doc="1 once the history holds an observation"),
            BufferSpec(self.QUEUE, (c.n_action_steps, c.action_dim), torch.float32, group="policy",
                       doc="action queue (normalised)"),
            BufferSpec(self.LEFT, (), torch.int64, group="policy", doc="actions left in the queue"),
            BufferSpec(self.RNG_SEED, (), torch.int64, group="rng", doc="noise seed of this episode"),
            BufferSpec(self.PLANS, (), torch.int64, group="rng", doc="chunks planned this episode (noise counter)"),
        ]

    def init_state(self, arena: StateArena) -> None:
        arena[self.RNG_SEED].fill_(self.cfg.seed)

    # --- step -----------------------------------------------------------------------
    def noise(self, seed: Tensor, plan: Tensor, draw: int) -> Tensor:
        """Draw ``draw`` (0: initial sample, 1 + j: DDPM step j) of plan number ``plan``: ``(horizon, A)``."""
        c = self.cfg
        counter = plan * (len(self.steps) + 1) + draw
        return normal(seed, counter, c.horizon * c.action_dim).view(c.horizon, c.action_dim)

    def denoise(self, global_cond: Tensor, seed: Tensor, plan: Tensor, supplied: Tensor | None = None) -> Tensor:
        """The K-step reverse process from this plan's noise: normalised actions ``(horizon, A)``, fp32.

        ``supplied``: the plan's draws ``noise_shape()`` from outside (``noise_from_input``),
        else the counter RNG's. The sample and the scheduler arithmetic are fp32
        whatever the weights' dtype; only the UNet runs in it.
        """
        c = self.cfg
        dtype = global_cond.dtype
        unet = self.diffusion.unet
        films = unet.films(self.timesteps, global_cond)
        def draw(i: int) -> Tensor:
            return (self.noise(seed, plan, i) if supplied is None else supplied[i].float()).unsqueeze(0)
        x = draw(0)
        clip = c.clip_sample_range if c.clip_sample else None
        for j, coeffs in enumerate(self.steps):
            out = unet.run(x.to(dtype), [f[j:j + 1] for f in films]).float()
            z = draw(1 + j) if coeffs.sigma > 0 else None
            x = reverse_step(c.noise_scheduler_type, c.prediction_type, coeffs, out, x, z, clip)
        return x[0]

    def action_queue(self) -> ActionQueue:
        c = self.cfg
        return ActionQueue(self.LEFT, c.n_action_steps, chunk=self.QUEUE, planned=(self.PLANS,),
                           chunk_size=c.horizon - (c.n_obs_steps - 1),
                           ahead=c.horizon - (c.n_obs_steps - 1) - c.n_action_steps)

    def step_observation(self, observation: Mapping[str, Tensor], arena: StateArena,
                         replan: bool | None = None) -> Tensor:
        """Update the observation history; on a replanning step plan a chunk into the queue; pop it."""
        if replan is None:
            raise InvalidArgument("Diffusion Policy: the caller decides replan (see action_queue)")
        c = self.cfg
        started = arena[self.STARTED].bool()
        latest = {"state": self.norm.input(STATE, observation[STATE])}
        if c.cameras:
            latest["images"] = torch.stack([self.norm.input(cam, observation[cam]) for cam in c.cameras])
        if c.env_state_dim:
            latest["env"] = self.norm.input(ENV_STATE, observation[ENV_STATE])
        for k, x in latest.items():                       # LeRobot fills the history with copies at first
            buf = arena[self.HIST_PREFIX + k]
            buf.copy_(torch.where(started, torch.cat([buf[1:], x.unsqueeze(0)]), x.unsqueeze(0).expand_as(buf)))
        arena[self.STARTED].fill_(1)

        if replan:
            self.plan(observation, arena)
        return self.norm.action(pop_queue(arena[self.QUEUE], arena[self.LEFT]))

    def plan(self, observation: Mapping[str, Tensor], arena: StateArena, guide: Guidance | None = None,
             ahead: Tensor | None = None) -> None:
        """A new chunk into the queue from the observation history (this step already added its
        observation): the reverse process from this plan's noise, the executed window of it queued."""
        if guide is not None:
            raise InvalidArgument("Diffusion Policy denoises with DDPM/DDIM: Real-Time Chunking needs a "
                                  "flow-matching policy (use replan async)")
        c = self.cfg
        dtype = self.diffusion.unet.final_conv[1].weight.dtype
        hist = {k: arena[self.HIST_PREFIX + k] for k in self._history_keys()}
        images, env = hist.get("images"), hist.get("env")
        cond = self.diffusion.global_cond(hist["state"].to(dtype), None if images is None else images.to(dtype),
                                          None if env is None else env.to(dtype))
        supplied = observation[self.NOISE].view(self.noise_shape()) if self.noise_input else None
        plans = arena[self.PLANS]
        chunk = self.denoise(cond, arena[self.RNG_SEED], plans, supplied)
        start = c.n_obs_steps - 1
        arena[self.QUEUE].copy_(chunk[start:start + c.n_action_steps])
        if ahead is not None:
            ahead.copy_(chunk[start + c.n_action_steps:start + c.n_action_steps + ahead.shape[0]])
        plans.add_(1)
        arena[self.LEFT].fill_(c.n_action_steps)

    def _history_keys(self) -> list[str]:
        """The observation histories the arena keeps (state, and images / env where the policy has them)."""
        c = self.cfg
        return ["state"] + (["images"] if c.cameras else []) + (["env"] if c.env_state_dim else [])
