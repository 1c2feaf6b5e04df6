"""The interrupt trees, through ROS: py_trees drives a trained policy node with RunPolicy goals.

    MUJOCO_GL=egl python examples/arm_interrupt_trees.py --episodes 5 --policy act

The ROS subset of ``python -m benchmarks.arm_interrupts`` (which runs the
bulk in-process): the MuJoCo arm node (lock-step), the policy node hosting a trained
checkpoint (``policy:=lerobot:<dir>``, ``run_mode: goal``: it steps only while a
RunPolicy goal runs; JointState and ``/sim/target`` in, Float64MultiArray out) and
this supervisor, which owns the command mux (policy, hold, operator -> ``/sim/command``)
and ticks one tree per episode::

    episode (parallel: the first to succeed ends it)
    ├── task done?                  tip within 3 cm of the target, at rest (the mux watches)
    └── interrupt and resume (sequence)
        ├── policy drives           RunPolicy(max_steps = interrupt step); the mux holds the last command
        ├── undo the held step      Rollback(1): the command was never executed  [not for sim restored]
        ├── snapshot policy         capsule
        ├── (snapshot sim)          [sim restored]
        ├── pause: hold arm         the arm holds its last command for k periods; no goal: the policy is still
        │   override: parallel      RunPolicy(k-1) whose commands the mux drops, and the operator driving the
        │                           arm toward a random pose for k periods
        ├── resume                  restore policy | reset policy | restore sim + restore policy + hand back
        └── policy drives           RunPolicy(max_steps = the rest of the time limit)

Halting the parallel when the task is done cancels the running RunPolicy goal at a
committed boundary. The uninterrupted cell is "task done?" beside one RunPolicy goal.
Each episode uses the benchmark's seeds, interrupt step and operator pose
(``Interrupt.for_seed``), so its outcome can be compared with the in-process run.
An episode ends when its tree has ended and the node has settled (``tick_to_end``: the
finished tree is not ticked again, see there). ACT only by default: it draws no noise, so
the node's plain ``reset`` makes it repeatable (Diffusion's noise seed is set in-process by ``capsules.reset(seed=...)``,
which the Trigger ``~/reset`` service cannot pass).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import py_trees
import rclpy
from py_trees.common import ParallelPolicy, Status
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks.arm_interrupts import CELLS, Episode, Interrupt, summarize  # noqa: E402
from flashrt_ros.bt import Reset, Restore, Rollback, RunPolicy, Snapshot  # noqa: E402
from flashrt_ros.bt.requests import halted_goals_settled  # noqa: E402
from flashrt_ros.client import FlashRTClient  # noqa: E402
from flashrt_ros.client.background_executor import BackgroundExecutor  # noqa: E402
from flashrt_ros.sim.arm_task import ReachCriterion, forward_kinematics  # noqa: E402
from mujoco_interrupt_resume import arm_topics, policy_parameters  # noqa: E402

os.environ.setdefault("MUJOCO_GL", "egl")


class Mux:
    """Routes policy commands to the sim (or holds / drops them) and watches the task."""

    def __init__(self, node: Any, criterion: ReachCriterion) -> None:
        self._pub = arm_topics(node, self._on_policy, self._on_joints, self._on_target)
        self.criterion, self.lock = criterion, threading.Lock()
        self.policy_total = 0                      # every policy command ever received (never reset)
        self.start(None)

    def start(self, hold_after: int | None, measure_at: int | None = None) -> None:
        """A new episode: hold the policy command at index ``hold_after`` (the interrupt), or
        (uninterrupted) measure the jump at index ``measure_at``."""
        with self.lock:
            self.mode, self.hold_after, self.held, self.measure_at = "policy", hold_after, None, measure_at
            self.last_before_hold: np.ndarray | None = None
            self.interrupted = False
            self.obs = self.commands = self.policy_msgs = self.forwarded = 0
            self.target, self.q, self.last = np.full(2, np.nan), np.zeros(2), None
            self.reached_at: int | None = None
            self.actions: list[bytes] = []
            self.jump: float | None = None
            self.measure_next = False

    # --- executor callbacks -----------------------------------------------------------
    def _on_target(self, msg: Float32MultiArray) -> None:
        with self.lock:
            self.target = np.array(msg.data, dtype=np.float64)

    def _on_joints(self, msg: JointState) -> None:
        with self.lock:
            self.obs += 1
            self.q = np.array(msg.position, dtype=np.float64)
            if self.last is None:
                self.last = self.q.copy()          # after a reset the arm holds ctrl = qpos
            if (self.mode == "policy" and self.forwarded and self.reached_at is None and self.criterion.reached(
                    forward_kinematics(self.q), self.target, np.array(msg.velocity))):
                self.reached_at = self.forwarded
                self.mode = "done"                 # the task is done: no further command goes out

    def _on_policy(self, msg: Float64MultiArray) -> None:
        with self.lock:
            self.policy_msgs += 1
            self.policy_total += 1
            if self.mode != "policy":
                return                              # the operator drives: dropped
            if self.hold_after is not None and self.forwarded == self.hold_after:
                self.mode, self.held, self.hold_after = "hold", msg, None
                self.last_before_hold, self.interrupted = self.last, True
                return
            self._forward(np.asarray(msg.data, dtype=np.float64))

    def _forward(self, action: np.ndarray) -> None:
        if self.measure_next or self.forwarded == self.measure_at:
            self.jump, self.measure_next = float(np.max(np.abs(action - self.last))), False
        self.actions.append(action.tobytes())
        self.forwarded += 1
        self._send(action)

    def _send(self, command: np.ndarray) -> None:
        self.commands += 1
        self.last = command
        self._pub.publish(Float64MultiArray(data=command.tolist()))

    # --- used by the tree (main thread) ----------------------------------------------------
    def quiescent(self, policy_answers: bool = False) -> bool:
        with self.lock:
            return self.obs == self.commands + 1 and (not policy_answers or self.policy_msgs == self.obs)

    def send(self, command: np.ndarray | None = None) -> None:
        with self.lock:
            self._send(self.last if command is None else command)

    def set_mode(self, mode: str) -> None:
        with self.lock:
            self.mode = mode

    def resume(self, hand_back: bool) -> None:
        """Back to the policy; the next forwarded command's jump is measured. ``hand_back`` (the
        physics was restored): the held command goes out, measured from the command before the hold."""
        with self.lock:
            self.mode, self.measure_next = "policy", True
            held, self.held = self.held, None
            if hand_back and held is not None:
                self.last = self.last_before_hold
                self._forward(np.asarray(held.data, dtype=np.float64))


class Condition(py_trees.behaviour.Behaviour):
    def __init__(self, name: str, test: Any, running: bool = False) -> None:
        super().__init__(name)
        self.test, self.running = test, running

    def update(self) -> Status:
        return Status.SUCCESS if self.test() else (Status.RUNNING if self.running else Status.FAILURE)


class Drive(py_trees.behaviour.Behaviour):
    """``steps`` commands to the arm, one per observation: hold the last one, or the operator's."""

    def __init__(self, name: str, mux: Mux, steps: int, pose: np.ndarray | None, max_step: float = 0.15) -> None:
        super().__init__(name)
        self.mux, self.steps, self.pose, self.max_step, self.sent = mux, steps, pose, max_step, 0

    def initialise(self) -> None:
        self.sent = 0
        self.mux.set_mode("operator")

    def update(self) -> Status:
        if not self.mux.quiescent(policy_answers=self.pose is not None and self.sent < self.steps):
            return Status.RUNNING
        if self.sent == self.steps:
            return Status.SUCCESS
        if self.pose is None:
            self.mux.send()
        else:
            q = self.mux.q
            self.mux.send(q + np.clip(self.pose - q, -self.max_step, self.max_step))
        self.sent += 1
        self.feedback_message = f"{self.sent}/{self.steps}"
        return Status.RUNNING


class Resume(py_trees.behaviour.Behaviour):
    """Hand control back to the policy; with the sim restored, the held command goes out first,
    and SUCCESS waits until the policy node holds the observation it produced (else the next
    goal would step on the older observation still pending from the override)."""

    def __init__(self, mux: Mux, hand_back: bool, inputs: Any) -> None:
        super().__init__("hand control back")
        self.mux, self.hand_back, self.inputs, self.seen = mux, hand_back, inputs, None

    def initialise(self) -> None:
        self.seen = None

    def update(self) -> Status:
        if self.seen is None:
            self.seen = {n: self.inputs.received(n) for n in self.inputs.names}
            self.mux.resume(self.hand_back)
        arrived = not self.hand_back or all(self.inputs.received(n) > c for n, c in self.seen.items())
        return Status.SUCCESS if self.mux.quiescent() and arrived else Status.RUNNING


def build_tree(cell: str, mux: Mux, policy: FlashRTClient, sim: FlashRTClient, plan: Interrupt, k: int,
               limit: int, inputs: Any) -> py_trees.behaviour.Behaviour:
    done = Condition("task done?", lambda: mux.reached_at is not None, running=True)
    if cell == "uninterrupted":
        body: py_trees.behaviour.Behaviour = RunPolicy("policy drives", policy, max_steps=limit)
    else:
        kind, _, resume = cell.partition("_")
        steps: list[py_trees.behaviour.Behaviour] = [RunPolicy("policy drives", policy, max_steps=plan.start + 1)]
        if resume != "sim_restored":
            steps.append(Rollback("undo the held step", policy, 1))
        steps.append(Snapshot("snapshot policy", policy, "interrupt", overwrite=True))
        if resume == "sim_restored":
            steps.append(Snapshot("snapshot sim", sim, "interrupt"))
        if kind == "pause":
            steps.append(Drive("hold arm", mux, k, None))
        else:
            steps.append(py_trees.composites.Parallel("operator override", ParallelPolicy.SuccessOnAll(), children=[
                RunPolicy("policy sees (commands dropped)", policy, max_steps=k - 1),
                Drive("operator drives", mux, k, plan.pose)]))
        if resume == "restore":
            steps.append(Restore("restore policy", policy, "interrupt"))
        elif resume == "reset":
            steps.append(Reset("reset policy", policy))
        else:
            steps += [Restore("restore sim", sim, "interrupt"), Restore("restore policy", policy, "interrupt")]
        steps.append(Resume(mux, resume == "sim_restored", inputs))
        # the held step counts when its command is handed back; otherwise it was undone
        rest = limit - plan.start - (1 if resume == "sim_restored" else 0)
        steps.append(RunPolicy("policy drives on", policy, max_steps=rest))
        body = py_trees.composites.Sequence("interrupt and resume", memory=True, children=steps)
    return py_trees.composites.Parallel("episode", ParallelPolicy.SuccessOnOne(), children=[done, body])


def tick_to_end(tree: py_trees.behaviour.Behaviour, settled: Callable[[], bool], deadline: float,
                on_tick: Callable[[], None] = lambda: None, period_s: float = 0.002) -> Status:
    """Tick ``tree`` until it ends, then wait for ``settled()`` WITHOUT ticking it again.

    Why: a finished py_trees tree that is ticked again starts over. Here the episode's
    parallel would re-run its RunPolicy, whose new goal is halted at once but reaches
    the node anyway, after the episode ended: it then stepped on the next episode's
    first observation (one command the next goal never counted, and its episode stalled).
    Returns SUCCESS / FAILURE, or RUNNING when ``deadline`` (monotonic) passed first.
    """
    while tree.status in (Status.INVALID, Status.RUNNING):
        if time.monotonic() > deadline:
            return Status.RUNNING
        tree.tick_once()
        on_tick()
        if tree.status is Status.RUNNING:
            time.sleep(period_s)
    if tree.status is Status.FAILURE:
        return Status.FAILURE
    while not settled():
        if time.monotonic() > deadline:
            return Status.RUNNING
        time.sleep(period_s)
    return tree.status


class Supervisor:
    """The sim and the policy node on one executor, and this supervisor's mux and clients."""

    def __init__(self, policy: str, capsule_dir: str) -> None:
        from flashrt_ros.ros.node import FlashRTNode
        from flashrt_ros.sim.node import SimNode
        self.owns_rclpy = not rclpy.ok()
        if self.owns_rclpy:
            rclpy.init()
        params = policy_parameters(capsule_dir, policy) | {"run_mode": "goal"}
        self.sim_node = SimNode("sim", parameter_overrides=[Parameter("render", value=False)])
        self.policy_node = FlashRTNode("flashrt", namespace="/arm", parameter_overrides=[
            Parameter(k, value=v) for k, v in params.items()])
        self.node = rclpy.create_node("arm_tree_supervisor")
        self.executor = MultiThreadedExecutor(num_threads=6)
        for n in (self.sim_node, self.policy_node, self.node):
            self.executor.add_node(n)
        self.spinner = BackgroundExecutor(self.executor)   # one raising callback must not stop every reply
        self.policy_node.trigger_configure()
        self.policy_node.trigger_activate()
        if not self.policy_node._active:
            raise RuntimeError("the policy node did not activate (see its log)")
        self.criterion = ReachCriterion()
        self.mux = Mux(self.node, self.criterion)
        self.policy = FlashRTClient(self.node, "/arm/flashrt")
        self.sim = FlashRTClient(self.node, "/sim")

    def run(self, seed: int, cell: str, k: int, timeout_s: float = 300.0, show: bool = False) -> Episode:
        plan = Interrupt.for_seed(seed)
        limit = self.criterion.time_limit_steps
        inputs = self.policy_node._policy_io.inputs
        tree = build_tree(cell, self.mux, self.policy, self.sim, plan, k, limit, inputs)
        self.sim_node.set_parameters([Parameter("seed", value=seed)])
        uninterrupted = cell == "uninterrupted"
        self.mux.start(None if uninterrupted else plan.start, plan.start if uninterrupted else None)
        # generous: a new client's first calls wait for discovery, slow on a loaded machine
        self.policy.call("reset", timeout_s=120.0)
        seen = {name: inputs.received(name) for name in inputs.names}
        self.sim.call("reset", timeout_s=120.0)    # publishes the first observation
        # the policy node must hold this episode's first observation before a goal may step on it
        self._wait(lambda: all(inputs.received(n) > seen[n] for n in seen), "the first observation")
        shown = False

        def show_once() -> None:
            nonlocal shown
            if show and not shown and cell != "uninterrupted" and self.mux.mode == "operator":
                print(py_trees.display.unicode_tree(tree, show_status=True))
                shown = True

        status = tick_to_end(tree, self._settled, time.monotonic() + timeout_s, on_tick=show_once)
        if status is Status.FAILURE:
            failed = [b for b in tree.iterate() if b.status is Status.FAILURE]
            raise RuntimeError(f"[{cell} seed {seed}] {failed[-1].name}: {failed[-1].feedback_message}")
        if status is not Status.SUCCESS:
            m = self.mux
            raise RuntimeError(f"[{cell} seed {seed}] the episode did not finish within {timeout_s:g} s "
                               f"(tree {status.value}; mux {m.mode}: obs {m.obs}, commands {m.commands}, "
                               f"policy {m.policy_msgs}, forwarded {m.forwarded}; goal running: "
                               f"{not self._idle()}; halted goals settled: {halted_goals_settled(self.policy)})\n"
                               + py_trees.display.unicode_tree(tree, show_status=True))
        tree.shutdown()
        m = self.mux
        return Episode(seed, m.reached_at is not None, m.reached_at, m.interrupted, m.jump,
                       actions=list(m.actions))

    @staticmethod
    def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not arrive within {timeout_s:g} s")
            time.sleep(0.002)

    def _settled(self) -> bool:
        """The episode is over at the node too: no goal running or still on its way (a halted goal
        has reported its result), every command sent and answered, none left to reach the mux."""
        return halted_goals_settled(self.policy) and self._idle() and self.mux.quiescent() and self._delivered()

    def _delivered(self) -> bool:
        """Every command the policy node published has reached the mux: none can leak into the next episode."""
        with self.mux.lock:
            return self.mux.policy_total == self.policy_node._policy_io.steps

    def _idle(self) -> bool:
        """No goal running: the halted RunPolicy goal (if any) has reported its result."""
        io = self.policy_node._policy_io
        return io is None or io.goal is None

    def close(self) -> None:
        self.spinner.stop()          # before releasing anything: no dispatched callback is left running
        self.policy_node._release_engine()
        for n in (self.node, self.policy_node, self.sim_node):
            self.executor.remove_node(n)
            n.destroy_node()
        if self.owns_rclpy:
            rclpy.try_shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--policy", default="act", choices=("act", "diffusion"))
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--interrupt-steps", type=int, default=25)
    ap.add_argument("--show", action="store_true", help="print each interrupt tree once")
    args = ap.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.episodes)
    results: dict[str, list[Episode]] = {}
    with tempfile.TemporaryDirectory(prefix="arm_trees_") as capsules:
        sup = Supervisor(args.policy, capsules)
        try:
            for cell in [c for c in args.cells.split(",") if c]:
                results[cell] = [sup.run(s, cell, args.interrupt_steps, show=args.show and s == seeds[0])
                                 for s in seeds]
                c = summarize(results[cell])
                print(f"{args.policy} {cell:22s} through ROS: success {c['successes']}/{c['episodes']}, "
                      f"steps {c['steps_to_success']:.1f}, jump {c['jump_rad']:.3f} rad", flush=True)
        finally:
            sup.close()
    ok = True
    if "uninterrupted" in results and "override_sim_restored" in results:
        same = all(a.actions == b.actions for a, b in zip(results["uninterrupted"], results["override_sim_restored"]))
        print(f"override + sim restored vs uninterrupted through ROS: {'BIT-IDENTICAL' if same else 'DIFFERENT'}")
        ok = same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
