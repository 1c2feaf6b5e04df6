"""Record scripted-expert demonstrations of the arm's reaching task as a LeRobotDataset on local disk.

    .venv-train/bin/python examples/train_arm/record.py --root /tmp/arm_reach --episodes 300

Runs in the training venv (LeRobot 0.4.4's own ``LeRobotDataset.create / add_frame /
save_episode / finalize``; no hub). Each episode is one seed of the MuJoCo arm
(``flashrt_ros.sim.arm``: start pose and target drawn from the seed) driven by
``flashrt_ros.sim.arm_task.ReachExpert``. Features:

* ``observation.state`` (4): shoulder, elbow positions [rad], then velocities [rad/s]
  (what the sim node's JointState carries, field-major as the policy node reads it);
* ``observation.environment_state`` (2): the target's x, y [m] (the sim node's ``~/target``);
* ``action`` (2): the expert's joint position targets [rad].

So the policy sees states off the expert's own path, the executed command is the
expert's plus Gaussian noise (``--noise``), and in a fraction of episodes
(``--excursions``) an "operator" pulls the arm toward a random pose for 8-20
steps; every frame is labelled with the clean expert action from where the arm
is. Training seeds start at ``--first-seed`` (default 100000), far from the
evaluation's seeds (0...).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # flashrt_ros.sim from this checkout

from flashrt_ros.sim.arm import ArmConfig, ArmSim  # noqa: E402
from flashrt_ros.sim.arm_task import ReachExpert  # noqa: E402

FPS = 50
FEATURES = {
    "observation.state": {"dtype": "float32", "shape": (4,),
                          "names": ["shoulder.pos", "elbow.pos", "shoulder.vel", "elbow.vel"]},
    "observation.environment_state": {"dtype": "float32", "shape": (2,), "names": ["target.x", "target.y"]},
    "action": {"dtype": "float32", "shape": (2,), "names": ["shoulder", "elbow"]},
}
TASK = "reach the target"


def record(root: Path, episodes: int, steps: int, first_seed: int, noise: float, excursions: float,
           seed: int) -> None:
    import lerobot_compat
    lerobot_compat.apply()
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    if root.exists():
        shutil.rmtree(root)
    ds = LeRobotDataset.create(repo_id="local/arm_reach", fps=FPS, features=FEATURES, root=root,
                               robot_type="flashrt_mujoco_arm", use_videos=False)
    rng = np.random.default_rng(seed)
    sim = ArmSim(ArmConfig(render=False))
    expert = ReachExpert()
    for e in range(episodes):
        sim.reset(first_seed + e)
        excursion = (int(rng.integers(10, steps - 40)), int(rng.integers(8, 21)),
                     rng.uniform(-2.0, 2.0, 2)) if rng.random() < excursions else None
        for t in range(steps):
            q, target = sim.joint_positions(), sim.target_xy()
            action = expert.action(q, target)
            ds.add_frame({"observation.state": np.concatenate([q, sim.joint_velocities()]).astype(np.float32),
                          "observation.environment_state": target.astype(np.float32),
                          "action": action.astype(np.float32), "task": TASK})
            if excursion and excursion[0] <= t < excursion[0] + excursion[1]:
                command = q + np.clip(excursion[2] - q, -0.15, 0.15)
            else:
                command = action + rng.normal(0.0, noise, 2)
            sim.step(command)
        ds.save_episode()
    ds.finalize()
    sim.close()
    print(f"recorded {episodes} episodes x {steps} frames into {root}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--episodes", type=int, default=300)
    ap.add_argument("--steps", type=int, default=150, help="frames per episode (50 Hz)")
    ap.add_argument("--first-seed", type=int, default=100_000)
    ap.add_argument("--noise", type=float, default=0.03, help="rad, std of the executed command's noise")
    ap.add_argument("--excursions", type=float, default=0.3, help="fraction of episodes with an operator excursion")
    ap.add_argument("--seed", type=int, default=0, help="seed of the noise and the excursions")
    args = ap.parse_args()
    record(args.root, args.episodes, args.steps, args.first_seed, args.noise, args.excursions, args.seed)


if __name__ == "__main__":
    main()
