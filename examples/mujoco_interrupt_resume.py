"""A policy drives a MuJoCo arm; an operator override interrupts it and the episode resumes bit-exactly.

    MUJOCO_GL=egl python examples/mujoco_interrupt_resume.py --out /tmp/arm_demo

Three nodes in one process (the launch file ``launch/mujoco_demo.launch.py``
starts the same three as separate processes): the MuJoCo arm (``flashrt_sim``,
lock-step: one physics step per command), the policy node (``flashrt_node``
with the chunked reference policy, JointState in, Float64MultiArray out) and
this supervisor, which owns a command mux (policy or operator -> ``/sim/command``)
and ticks a py_trees tree:

    arm supervisor (selector)
    ├── operator override (sequence)
    │   ├── override requested?     the operator's event: the mux holds the policy's next command
    │   ├── snapshot policy         capsule of the policy's complete state (flashrt Snapshot)
    │   ├── snapshot sim            MuJoCo mj_getState(mjSTATE_INTEGRATION)
    │   ├── retract arm (operator)  another behaviour moves the arm; the policy keeps stepping
    │   │                           on what it sees (its commands are dropped): its state drifts
    │   ├── restore sim             mj_setState
    │   ├── restore policy          flashrt Restore (or, in the control run, a plain reset)
    │   └── hand control back       the held command goes out; the episode continues
    └── policy drives

It runs the episode three times from the same seed: uninterrupted, interrupted
(restore both), and interrupted with a plain policy reset instead of a restore.
It prints the tree with statuses at each interrupt and resume, checks that the
interrupted run's policy commands are bit-identical to the uninterrupted run's
and that the reset run's differ, reports the loop's step times, and writes
``arm_demo.png`` (joint trajectories overlaid, camera frames). Exit status 0
only when both checks hold.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import py_trees
import rclpy
from py_trees.common import Status
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from flashrt_ros.bt import Restore, ServiceBehaviour, Snapshot  # noqa: E402
from flashrt_ros.client import FlashRTClient  # noqa: E402
from flashrt_ros.client.background_executor import BackgroundExecutor  # noqa: E402
from flashrt_ros.sim.arm_policy import trained_policy_spec  # noqa: E402
from flashrt_ros.sim.arm_task import ReachCriterion, forward_kinematics  # noqa: E402

os.environ.setdefault("MUJOCO_GL", "egl")        # headless rendering (read when mujoco is imported)
RELIABLE = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)


def policy_parameters(capsule_dir: str, policy: str = "act") -> dict[str, Any]:
    """The policy node's parameters for the arm (the launch file's config/arm_demo.yaml says the same).

    ``policy``: ``act`` / ``diffusion`` (the trained checkpoints, ``policy:=lerobot:<dir>``,
    which also read the target) or ``random`` (the untrained reference transformer, state only)."""
    trained = policy != "random"
    return {
        "engine_kind": "policy", "device": "cpu",
        "policy": trained_policy_spec(policy) if trained else "flashrt_ros.sim.arm_policy:arm_policy",
        "input_environment_state_topic": "/sim/target" if trained else "",
        "control_rate_hz": 50.0, "control_trigger": "inputs", "input_state_topic": "",
        "input_joint_state_topic": "/sim/joint_states", "input_joint_names": ["shoulder", "elbow"],
        "input_joint_fields": ["position", "velocity"], "qos_reliability": "reliable",
        "qos_depth": 10, "max_observation_age_s": 5.0, "output_type": "float64_array",
        "output_topic": "/arm/policy_command", "output_joint_names": ["shoulder", "elbow"],
        "capsule_directory": capsule_dir, "status_period_s": 1.0,
    }


@dataclass
class Episode:
    """What one run recorded (observation index = sim steps published since the reset)."""

    actions: list[bytes] = field(default_factory=list)          # forwarded policy commands
    joints: list[tuple[int, str, np.ndarray]] = field(default_factory=list)   # (obs index, mode, q)
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    loop_s: list[float] = field(default_factory=list)           # command -> next policy command
    reached_at: int | None = None       # first observation under policy control with the task done


def arm_topics(node: Any, on_policy: Any, on_joints: Any, on_target: Any) -> Any:
    """The supervisor's side of the arm's topics; returns the publisher of the sim's command."""
    node.create_subscription(Float64MultiArray, "/arm/policy_command", on_policy, RELIABLE)
    node.create_subscription(JointState, "/sim/joint_states", on_joints, RELIABLE)
    node.create_subscription(Float32MultiArray, "/sim/target", on_target, RELIABLE)
    return node.create_publisher(Float64MultiArray, "/sim/command", RELIABLE)


class CommandMux:
    """Policy or operator commands to the sim; holds the policy's command at override points."""

    def __init__(self, node: Any, frame_every: int) -> None:
        self._pub = arm_topics(node, self._on_policy, self._on_joints, self._on_target)
        node.create_subscription(Image, "/sim/image", self._on_image, RELIABLE)
        self.criterion, self.target = ReachCriterion(), np.full(2, np.nan)
        self.lock = threading.Lock()
        self.frame_every = frame_every
        self.start(0, ())

    def start(self, steps: int, hold_at: tuple[int, ...]) -> None:
        with self.lock:
            self.episode, self.steps, self.hold_at = Episode(), steps, sorted(hold_at)
            self.mode, self.held = "policy", None
            self.obs = self.commands = self.policy_msgs = 0
            self.q = np.zeros(2)
            self._sent_at = None

    # --- callbacks (executor threads) ---------------------------------------------
    def _on_policy(self, msg: Float64MultiArray) -> None:
        with self.lock:
            self.policy_msgs += 1
            if self._sent_at is not None and self.mode == "policy":
                self.episode.loop_s.append(time.perf_counter() - self._sent_at)
            if self.mode != "policy":
                return                                   # operator in control: dropped
            done = len(self.episode.actions)
            if done >= self.steps:
                self.mode = "done"
            elif self.hold_at and done == self.hold_at[0]:
                self.hold_at.pop(0)
                self.mode, self.held = "hold", msg
            else:
                self._forward(msg)

    def _on_target(self, msg: Float32MultiArray) -> None:
        with self.lock:
            self.target = np.array(msg.data, dtype=np.float64)

    def _on_joints(self, msg: JointState) -> None:
        with self.lock:
            self.obs += 1
            self.q = np.array(msg.position, dtype=np.float64)
            if (self.episode.reached_at is None and self.mode != "operator" and self.criterion.reached(
                    forward_kinematics(self.q), self.target, np.array(msg.velocity))):
                self.episode.reached_at = len(self.episode.actions)
            self.episode.joints.append((self.obs - 1, self.mode, self.q.copy()))

    def _on_image(self, msg: Image) -> None:
        with self.lock:
            index = self.obs                              # the image precedes its JointState
            if index % self.frame_every == 0 or self.mode == "operator":
                if self.mode != "operator" or index not in self.episode.frames:
                    self.episode.frames.setdefault(index if self.mode != "operator" else -index,
                                                   np.frombuffer(bytes(msg.data), np.uint8)
                                                   .reshape(msg.height, msg.width, 3))

    # --- used by the tree (main thread) -------------------------------------------
    def _forward(self, msg: Float64MultiArray) -> None:
        self.episode.actions.append(np.asarray(msg.data, dtype=np.float64).tobytes())
        self._send(list(msg.data))

    def _send(self, values: list[float]) -> None:
        self.commands += 1
        self._sent_at = time.perf_counter()
        self._pub.publish(Float64MultiArray(data=values))

    def quiescent(self) -> bool:
        """Every command answered by an observation, every observation by a policy command."""
        with self.lock:
            return self.obs == self.commands + 1 and self.policy_msgs == self.obs

    def holding(self) -> bool:
        with self.lock:
            return self.mode == "hold"

    def operator(self, command: list[float] | None = None) -> None:
        with self.lock:
            self.mode = "operator"
            if command is not None:
                self._send(command)

    def release(self) -> None:
        with self.lock:
            self.mode = "policy"
            held, self.held = self.held, None
            if held is not None:
                self._forward(held)

    def done(self) -> bool:
        with self.lock:
            return self.mode == "done"


# --- behaviours ---------------------------------------------------------------------
class OverrideRequested(py_trees.behaviour.Behaviour):
    """The operator's override event: SUCCESS once the mux holds the policy's command."""

    def __init__(self, mux: CommandMux) -> None:
        super().__init__("override requested?")
        self.mux = mux

    def update(self) -> Status:
        return Status.SUCCESS if self.mux.holding() and self.mux.quiescent() else Status.FAILURE


class Retract(py_trees.behaviour.Behaviour):
    """The other behaviour: the operator pulls the arm toward its zero pose for ``steps`` steps."""

    def __init__(self, mux: CommandMux, steps: int) -> None:
        super().__init__("retract arm (operator)")
        self.mux, self.steps, self.sent = mux, steps, 0

    def initialise(self) -> None:
        self.sent = 0
        self.mux.operator()

    def update(self) -> Status:
        if not self.mux.quiescent():
            return Status.RUNNING                  # the sim and the policy are still answering
        if self.sent == self.steps:
            return Status.SUCCESS
        self.mux.operator((0.6 * self.mux.q).tolist())
        self.sent += 1
        self.feedback_message = f"{self.sent}/{self.steps}"
        return Status.RUNNING


class HandBack(py_trees.behaviour.Behaviour):
    def __init__(self, mux: CommandMux) -> None:
        super().__init__("hand control back")
        self.mux = mux

    def update(self) -> Status:
        self.mux.release()
        return Status.SUCCESS


class PolicyDrives(py_trees.behaviour.Behaviour):
    def __init__(self, mux: CommandMux) -> None:
        super().__init__("policy drives")
        self.mux = mux

    def update(self) -> Status:
        return Status.SUCCESS if self.mux.done() else Status.RUNNING


class ResetPolicy(ServiceBehaviour):
    """A plain reset of the policy's state (the control run: what a restore avoids)."""

    verb = "reset"


def build_tree(mux: CommandMux, policy: FlashRTClient, sim: FlashRTClient, retract_steps: int,
               restore_policy: bool) -> py_trees.behaviour.Behaviour:
    back = (Restore("restore policy", policy, "override") if restore_policy
            else ResetPolicy("reset policy (no restore)", policy))
    override = py_trees.composites.Sequence("operator override", memory=True, children=[
        OverrideRequested(mux),
        Snapshot("snapshot policy", policy, "override", overwrite=True),
        Snapshot("snapshot sim", sim, "override"),
        Retract(mux, retract_steps),
        Restore("restore sim", sim, "override"),
        back,
        HandBack(mux)])
    return py_trees.composites.Selector("arm supervisor", memory=False,
                                        children=[override, PolicyDrives(mux)])


# --- running episodes -----------------------------------------------------------------
class Demo:
    """The three nodes on one executor; with ``external`` only the supervisor (launch file)."""

    def __init__(self, seed: int, image: int, render: bool, capsule_dir: str, frame_every: int,
                 external: bool = False, policy: str = "act") -> None:
        self.owns_rclpy = not rclpy.ok()
        if self.owns_rclpy:
            rclpy.init()
        try:
            self._start(seed, image, render, capsule_dir, frame_every, external, policy)
        except BaseException:
            if self.owns_rclpy:
                rclpy.try_shutdown()
            raise

    def _start(self, seed: int, image: int, render: bool, capsule_dir: str, frame_every: int,
               external: bool, policy: str) -> None:
        self.sim_node = self.policy_node = None
        self.node = rclpy.create_node("arm_supervisor")
        self.executor = MultiThreadedExecutor(num_threads=6)
        if not external:
            from flashrt_ros.ros.node import FlashRTNode
            from flashrt_ros.sim.node import SimNode
            self.sim_node = SimNode("sim", parameter_overrides=[
                Parameter("seed", value=seed), Parameter("render", value=render),
                Parameter("image_width", value=image), Parameter("image_height", value=image)])
            self.policy_node = FlashRTNode("flashrt", namespace="/arm", parameter_overrides=[
                Parameter(k, value=v) for k, v in policy_parameters(capsule_dir, policy).items()])
            self.executor.add_node(self.sim_node)
            self.executor.add_node(self.policy_node)
        self.executor.add_node(self.node)
        self.spinner = BackgroundExecutor(self.executor)
        if self.policy_node is not None:
            self.policy_node.trigger_configure()
            self.policy_node.trigger_activate()
            if not self.policy_node._active:
                raise RuntimeError("the policy node did not activate (see its log)")
        self.mux = CommandMux(self.node, frame_every)
        self.policy = FlashRTClient(self.node, "/arm/flashrt")
        self.sim = FlashRTClient(self.node, "/sim")

    def run(self, steps: int, interrupts: tuple[int, ...], retract: int, restore_policy: bool,
            show_tree: bool, label: str, timeout_s: float = 300.0) -> Episode:
        tree = build_tree(self.mux, self.policy, self.sim, retract, restore_policy)
        self.mux.start(steps, interrupts)
        self.policy.call("reset")
        self.sim.call("reset")                      # publishes the first observation: the loop starts
        override = tree.children[0]
        was_running = False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            tree.tick_once()
            running = override.status is Status.RUNNING
            if show_tree and running and not was_running:
                print(f"\n[{label}] interrupt at policy step {len(self.mux.episode.actions)}:")
                print(py_trees.display.unicode_tree(tree, show_status=True))
            if show_tree and override.status is Status.SUCCESS:
                print(f"\n[{label}] resumed at policy step {len(self.mux.episode.actions)}:")
                print(py_trees.display.unicode_tree(tree, show_status=True))
            failed = [b for b in tree.iterate() if b.status is Status.FAILURE
                      and b is not override.children[0] and b is not override]
            if failed:
                raise RuntimeError(f"{failed[0].name} failed: {failed[0].feedback_message}")
            was_running = running
            if tree.status is Status.SUCCESS and self.mux.done() and self.mux.quiescent():
                return self.mux.episode
            time.sleep(0.002)
        raise RuntimeError(f"[{label}] the episode did not finish within {timeout_s:g} s")

    def close(self) -> None:
        # Stop spinning (and let dispatched callbacks finish) before anything is released or
        # destroyed: "exception was never retrieved: cannot use Destroyable ..." otherwise.
        self.spinner.stop()
        if self.policy_node is not None:
            self.policy_node._release_engine()
        for n in (self.node, self.policy_node, self.sim_node):
            if n is not None:
                self.executor.remove_node(n)
                n.destroy_node()
        if self.owns_rclpy:
            rclpy.try_shutdown()


def percentiles_ms(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    a = np.sort(np.asarray(xs)) * 1e3
    return {"n": len(a), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "max": float(a[-1])}


def operator_runs(ep: Episode) -> list[list[np.ndarray]]:
    """Joint positions seen while the operator was in control, one list per override."""
    runs: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    for _index, mode, q in ep.joints:
        if mode == "operator":
            current.append(q)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def write_png(path: Path, reference: Episode, resumed: Episode, reset: Episode,
              interrupts: tuple[int, ...]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def policy_track(ep: Episode) -> tuple[np.ndarray, np.ndarray]:
        # Observations under policy control, by episode step: after a restore the
        # step count continues from the snapshot, so resumed segments overlay the reference.
        steps, qs, step = [], [], 0
        for _index, mode, q in ep.joints:
            if mode == "operator":
                continue
            steps.append(step)
            qs.append(q)
            step += 1
        return np.asarray(steps), np.asarray(qs)

    policy_frames = sorted((k, v) for k, v in resumed.frames.items() if k >= 0)
    operator_frames = sorted(((k, v) for k, v in resumed.frames.items() if k < 0), reverse=True)
    frames = policy_frames[:4] + operator_frames[:2]
    fig = plt.figure(figsize=(11, 7.5))
    grid = fig.add_gridspec(3, max(4, min(6, len(frames))))
    for j, name in enumerate(("shoulder", "elbow")):
        ax = fig.add_subplot(grid[j, :])
        for ep, style, label in ((reference, dict(color="0.6", lw=4), "uninterrupted"),
                                 (resumed, dict(color="tab:blue", lw=1.2, ls="--"),
                                  "interrupted + restored (bit-identical)"),
                                 (reset, dict(color="tab:orange", lw=1.2, ls=":"),
                                  "interrupted + plain policy reset")):
            s, q = policy_track(ep)
            ax.plot(s, q[:, j], label=label, **style)
        # the operator's excursions, drawn from their interrupt step at half-step spacing
        for r, (k, run) in enumerate(zip(interrupts, operator_runs(resumed))):
            xs = k + 0.5 * np.arange(1, len(run) + 1)
            ax.plot(xs, [q[j] for q in run], color="tab:red", lw=1.5,
                    label="operator retract (sim restored after)" if r == 0 else None)
        for k in interrupts:
            ax.axvline(k, color="tab:red", lw=0.6, alpha=0.5)
        ax.set_ylabel(f"{name} [rad]")
        if j == 0:
            ax.legend(loc="upper right", fontsize=7)
            ax.set_title("MuJoCo arm under the policy: joint positions per episode step")
    ax.set_xlabel("episode step (policy control; operator steps drawn at half-step spacing)")
    for c, (k, img) in enumerate(frames[: grid.ncols]):
        a = fig.add_subplot(grid[2, c])
        a.imshow(img, interpolation="nearest")
        a.set_title(f"obs {abs(k)}" + (" (operator)" if k < 0 else ""), fontsize=8)
        a.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120, help="policy steps per episode")
    ap.add_argument("--interrupts", default="20,60", help="policy steps at which the operator overrides")
    ap.add_argument("--policy", default="act", choices=("act", "diffusion", "random"),
                    help="the trained ACT / Diffusion Policy checkpoint, or the untrained reference")
    ap.add_argument("--retract-steps", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--image", type=int, default=64, help="camera width = height (pixels)")
    ap.add_argument("--no-render", action="store_true", help="no camera (state-only)")
    ap.add_argument("--out", type=Path, default=Path("arm_demo_out"))
    ap.add_argument("--quiet", action="store_true", help="do not print the trees")
    ap.add_argument("--external", action="store_true",
                    help="use a running sim and policy node (launch/mujoco_demo.launch.py)")
    args = ap.parse_args(argv)
    interrupts = tuple(int(x) for x in args.interrupts.split(",") if x)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arm_demo_capsules_") as capsules:
        demo = Demo(args.seed, args.image, not args.no_render, capsules,
                    frame_every=max(1, args.steps // 4), external=args.external,
                    policy=args.policy)
        try:
            reference = demo.run(args.steps, (), args.retract_steps, True, False, "uninterrupted")
            resumed = demo.run(args.steps, interrupts, args.retract_steps, True, not args.quiet,
                               "interrupted")
            reset = demo.run(args.steps, interrupts[:1], args.retract_steps, False, False, "reset")
            sim_steps = percentiles_ms(demo.sim_node.step_times_s if demo.sim_node else [])
            engine = (demo.policy_node._engine.latency() if demo.policy_node
                      else {"p50_ms": float("nan"), "p99_ms": float("nan")})
        finally:
            demo.close()
    identical = resumed.actions == reference.actions
    k = interrupts[0] if interrupts else 0
    reset_differs = reset.actions[:k] == reference.actions[:k] and reset.actions[k + 1:] != reference.actions[k + 1:]
    loop = percentiles_ms(reference.loop_s + resumed.loop_s + reset.loop_s)
    misses = sum(x > 0.02 for x in reference.loop_s + resumed.loop_s + reset.loop_s)
    print(f"\nuninterrupted vs interrupted+restored: {len(reference.actions)} policy commands, "
          f"{'BIT-IDENTICAL' if identical else 'DIFFERENT'}")
    for ep, label in ((reference, "uninterrupted"), (resumed, "interrupted+restored"), (reset, "plain reset")):
        print(f"{label}: " + (f"target reached at policy step {ep.reached_at} (tip within "
                              f"{ReachCriterion().radius_m * 100:.0f} cm, at rest)" if ep.reached_at is not None
                              else f"target not reached in {len(ep.actions)} policy steps"))
    print(f"uninterrupted vs interrupted+plain reset: "
          f"{'differs after the interrupt' if reset_differs else 'NO DIFFERENCE (unexpected)'}")
    print(f"loop (command -> sim step + render + publish -> policy step -> command): "
          f"p50 {loop.get('p50', float('nan')):.2f} ms, p99 {loop.get('p99', float('nan')):.2f} ms, "
          f"max {loop.get('max', float('nan')):.2f} ms over {loop['n']} steps; "
          f"{misses} over the 20 ms control period")
    print(f"sim step (physics + render + publish): p50 {sim_steps.get('p50', float('nan')):.2f} ms, "
          f"p99 {sim_steps.get('p99', float('nan')):.2f} ms; policy engine step: p50 {engine['p50_ms']:.2f} ms, "
          f"p99 {engine['p99_ms']:.2f} ms")
    if not args.no_render:
        write_png(args.out / "arm_demo.png", reference, resumed, reset, interrupts)
        print(f"wrote {args.out / 'arm_demo.png'}")
    return 0 if identical and reset_differs else 1


if __name__ == "__main__":
    sys.exit(main())
