"""A deterministic 2-D point mass that must reach a target.

Why: interrupt-and-resume proofs need a closed loop (actions change the next
observation) that is itself exactly replayable. This is the *world*, not the
engine: its state is plain numpy, saved and set with ``get_state``/``set_state``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ReachingConfig:
    dt: float = 0.02            # 50 Hz control
    mass: float = 1.0
    damping: float = 0.5        # linear drag, N per m/s
    max_force: float = 1.0      # actions are clipped to [-max_force, max_force]
    arena_half_width: float = 1.0
    success_radius: float = 0.05
    success_speed: float = 0.05
    max_steps: int = 500


class ReachingTask:
    """Point mass ``pos, vel`` in a box, pushed by a 2-D force toward ``target``.

    obs = ``[pos(2), vel(2), target(2)]`` (float32 torch), action = force (2).
    Reward is minus the distance minus a small force cost; ``done`` on success
    or after ``max_steps``.
    """

    obs_dim = 6
    act_dim = 2

    def __init__(self, cfg: ReachingConfig = ReachingConfig(), seed: int = 0) -> None:
        self.cfg = cfg
        self.reset(seed)

    def reset(self, seed: int) -> torch.Tensor:
        """Start a new episode; the start and target depend only on ``seed``."""
        rng = np.random.default_rng(seed)
        w = self.cfg.arena_half_width
        self.pos = rng.uniform(-w, w, 2)
        self.vel = np.zeros(2)
        self.target = rng.uniform(-w, w, 2)
        self.steps = 0
        return self.observation()

    def observation(self) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([self.pos, self.vel, self.target])).to(torch.float32)

    def step(self, action: torch.Tensor | np.ndarray) -> tuple[torch.Tensor, float, bool]:
        """Semi-implicit Euler step under the clipped force; returns ``obs, reward, done``."""
        c = self.cfg
        force = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -c.max_force, c.max_force)
        acc = (force - c.damping * self.vel) / c.mass
        self.vel = self.vel + c.dt * acc
        self.pos = np.clip(self.pos + c.dt * self.vel, -c.arena_half_width, c.arena_half_width)
        self.steps += 1
        dist = float(np.linalg.norm(self.target - self.pos))
        reward = -dist - 0.01 * float(force @ force)
        reached = dist < c.success_radius and float(np.linalg.norm(self.vel)) < c.success_speed
        return self.observation(), reward, reached or self.steps >= c.max_steps

    def expert_action(self, kp: float = 4.0, kd: float = 2.0) -> torch.Tensor:
        """A PD controller: a second, different behaviour for tests and benchmarks."""
        force = kp * (self.target - self.pos) - kd * self.vel
        return torch.from_numpy(np.clip(force, -self.cfg.max_force, self.cfg.max_force)).to(torch.float32)

    def get_state(self) -> dict:
        return {"pos": self.pos.copy(), "vel": self.vel.copy(), "target": self.target.copy(), "steps": self.steps}

    def set_state(self, state: dict) -> None:
        self.pos, self.vel, self.target = state["pos"].copy(), state["vel"].copy(), state["target"].copy()
        self.steps = int(state["steps"])
