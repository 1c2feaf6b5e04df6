"""The MuJoCo arm's reaching task: the scripted expert that demonstrates it and the test of success.

Why here (no ROS, no torch): the same two pieces serve the recording of
demonstrations (``examples/train_arm``), the evaluation
(``benchmarks.arm_interrupts``) and the tests, so "success" means
one thing everywhere.

The expert is inverse kinematics plus a rate limit: it computes the joint
angles that put the tip on the target (elbow bent positive, shoulder wrapped
into the actuator's range) and commands at most ``max_step`` radians per
control period ahead of the *measured* joint angles. Closed-loop on purpose: its
next command depends on where the arm is, so a policy that imitates it must
watch the arm (and an action planned for an arm that has since been moved is
stale).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LINK_M = 0.12                      # both links (arm.py's MJCF)
SHOULDER_LIMIT = 3.1               # actuator ctrlrange
ELBOW_LIMIT = 2.6


def inverse_kinematics(target_xy: np.ndarray) -> np.ndarray:
    """Joint angles (shoulder, elbow) that put the tip on ``target_xy`` (elbow >= 0)."""
    x, y = float(target_xy[0]), float(target_xy[1])
    r2 = x * x + y * y
    c2 = np.clip((r2 - 2 * LINK_M ** 2) / (2 * LINK_M ** 2), -1.0, 1.0)
    elbow = float(np.arccos(c2))
    shoulder = np.arctan2(y, x) - np.arctan2(LINK_M * np.sin(elbow), LINK_M * (1 + np.cos(elbow)))
    shoulder = (shoulder + np.pi) % (2 * np.pi) - np.pi
    return np.array([np.clip(shoulder, -SHOULDER_LIMIT, SHOULDER_LIMIT),
                     np.clip(elbow, -ELBOW_LIMIT, ELBOW_LIMIT)])


def forward_kinematics(q: np.ndarray) -> np.ndarray:
    a, b = float(q[0]), float(q[0] + q[1])
    return np.array([LINK_M * (np.cos(a) + np.cos(b)), LINK_M * (np.sin(a) + np.sin(b))])


@dataclass(frozen=True)
class ReachExpert:
    """``action(q, target) = q + clip(ik(target) - q, +-max_step)``: joint position targets."""

    max_step: float = 0.15          # rad per control period (20 ms)

    def action(self, q: np.ndarray, target_xy: np.ndarray) -> np.ndarray:
        goal = inverse_kinematics(target_xy)
        return q + np.clip(goal - q, -self.max_step, self.max_step)


@dataclass(frozen=True)
class ReachCriterion:
    """Success: the tip within ``radius_m`` of the target with every joint slower than
    ``max_speed`` rad/s, at some step before ``time_limit_steps``."""

    radius_m: float = 0.03          # the tip's marker (1.5 cm) overlaps the target sphere (2 cm)
    max_speed: float = 0.2          # rad/s: "at rest"
    time_limit_steps: int = 200     # 4 s at 50 Hz

    def reached(self, tip_xy: np.ndarray, target_xy: np.ndarray, qvel: np.ndarray) -> bool:
        return bool(np.linalg.norm(np.asarray(tip_xy) - np.asarray(target_xy)) <= self.radius_m
                    and np.max(np.abs(qvel)) <= self.max_speed)
