"""A behaviour tree that interrupts a running policy and resumes it exactly.

Start a policy node, then this script:

    python -m flashrt_ros.ros.node --ros-args -p engine_kind:=policy -p policy:=transformer \\
        -p autostart:=true -p device:=cpu
    python examples/interrupt_and_resume.py --namespace /flashrt --seconds 10

This process plays the world: it steps the simulated reaching task with the
node's actions (``~/action``) and publishes observations (``~/observation``).
Every second the tree

1. snapshots the policy (``Snapshot``) and saves the world state,
2. lets "another behaviour" take over for a moment: the policy is fed zero
   observations, which perturbs its recurrent state / history / chunk queue,
3. restores the capsule (``Restore``) and the world, and the task continues
   from exactly where it was interrupted.

Every behaviour sends its request on the first tick and polls afterwards, so
the tree keeps ticking at 50 Hz while services are in flight.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import py_trees
import rclpy
from py_trees.common import Status
from rclpy.duration import Duration
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile
from std_msgs.msg import Float32MultiArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout

from flashrt_ros.bt import Restore, Snapshot  # noqa: E402
from flashrt_ros.client import FlashRTClient  # noqa: E402
from flashrt_ros.sim import ReachingTask  # noqa: E402


class World:
    """The simulated task, fed by the node's actions."""

    def __init__(self, seed: int = 0) -> None:
        self.task = ReachingTask(seed=seed)
        self.other_behaviour = False      # True: the policy sees zeros and its actions are ignored
        self.saved: dict | None = None
        self.lock = threading.Lock()

    def on_action(self, msg: Float32MultiArray) -> None:
        with self.lock:
            if not self.other_behaviour:
                _, _, done = self.task.step(list(msg.data))
                if done:
                    self.task.reset(self.task.steps)

    def observation(self) -> list[float]:
        with self.lock:
            return [0.0] * 6 if self.other_behaviour else self.task.observation().tolist()


class WorldStep(py_trees.behaviour.Behaviour):
    """A one-tick behaviour that acts on the world (save/restore it, hand over control)."""

    def __init__(self, name: str, world: World, action: str) -> None:
        super().__init__(name)
        self.world, self.action = world, action

    def update(self) -> Status:
        w = self.world
        with w.lock:
            if self.action == "save":
                w.saved = w.task.get_state()
            elif self.action == "restore":
                w.task.set_state(w.saved)
            w.other_behaviour = self.action == "take_over"
        return Status.SUCCESS


def build_tree(client: FlashRTClient, world: World, period_s: float = 1.0,
               other_s: float = 0.2) -> py_trees.behaviour.Behaviour:
    """One interrupt cycle; wrap it in a repeat to run forever."""
    return py_trees.composites.Sequence("interrupt and resume", memory=True, children=[
        py_trees.timers.Timer("policy in control", duration=period_s),
        Snapshot("snapshot policy", client, "bt_checkpoint", overwrite=True),
        WorldStep("save world", world, "save"),
        WorldStep("other behaviour takes over", world, "take_over"),
        py_trees.timers.Timer("other behaviour", duration=other_s),
        Restore("restore policy", client, "bt_checkpoint"),
        WorldStep("restore world", world, "restore"),
    ])


def run(namespace: str, seconds: float, rate_hz: float = 50.0,
        until: Callable[[dict[str, int]], bool] | None = None) -> dict[str, int]:
    """Tick the tree at ``rate_hz`` for ``seconds`` (or until ``until(counts)`` holds, if given);
    returns cycle counts and the world's step count."""
    owns_rclpy = not rclpy.ok()
    if owns_rclpy:
        rclpy.init()
    node = rclpy.create_node("flashrt_bt_example")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    world = World()
    client = FlashRTClient(node, namespace)
    # offer a deadline no longer than the node requests (1.5 control periods by default)
    pub = node.create_publisher(Float32MultiArray, f"{namespace}/observation",
                                QoSProfile(depth=1, deadline=Duration(seconds=1.0 / rate_hz)))
    node.create_subscription(Float32MultiArray, f"{namespace}/action", world.on_action, QoSProfile(depth=1))
    cycle = build_tree(client, world)
    counts = {"succeeded": 0, "failed": 0}
    next_tick = time.monotonic()
    end = next_tick + seconds
    try:
        while next_tick < end:
            if until is not None and until({**counts, "world_steps": world.task.steps}):
                break
            pub.publish(Float32MultiArray(data=world.observation()))
            cycle.tick_once()
            if cycle.status is Status.SUCCESS:
                counts["succeeded"] += 1
            elif cycle.status is Status.FAILURE:
                counts["failed"] += 1
                failed = [b for b in cycle.iterate() if b.status is Status.FAILURE]
                node.get_logger().warning(f"cycle failed: {failed[0].name}: {failed[0].feedback_message}")
            next_tick += 1.0 / rate_hz
            while (left := next_tick - time.monotonic()) > 0:
                executor.spin_once(timeout_sec=left)           # completes the futures meanwhile
        counts["world_steps"] = world.task.steps
    finally:
        executor.remove_node(node)
        node.destroy_node()
        if owns_rclpy:
            rclpy.shutdown()
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description="interrupt-and-resume behaviour tree")
    ap.add_argument("--namespace", default="/flashrt")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    print(run(args.namespace, args.seconds))


if __name__ == "__main__":
    main()
