"""flashrt_sim: the MuJoCo arm (``sim.arm``) on ROS topics, with its own snapshot/restore.

Topics (under the node's namespace, default ``/sim``), the first six published with every observation,
reliable, transient local, keep-last 1 (a reader that subscribes transient local gets the latest at once):
- ``~/joint_states`` (pub, ``sensor_msgs/JointState``: shoulder, elbow; position, velocity)
- ``~/target`` (pub, ``std_msgs/Float32MultiArray``: the target's x, y in metres, the task's goal;
  a policy node reads it with ``input_environment_state_topic``)
- ``~/image`` (pub, ``sensor_msgs/Image`` rgb8 from the overhead camera; ``render:=false`` turns it off)
- ``~/steps`` (pub, ``std_msgs/UInt64``: physics steps since the reset: a tree waits on it until the
  sim has applied the last command, e.g. before a world snapshot)
- ``~/distance`` (pub, ``std_msgs/Float64``: the tip's distance to the target, metres) and
  ``~/reached`` (pub, ``std_msgs/Bool``: the tip on the target and at rest, ``ReachCriterion``), which
  the ``TargetReached`` tree node reads
- ``~/command`` (sub, ``std_msgs/Float64MultiArray``: the two joint position targets,
  as to a ros2_control forward position controller)

Parameters: ``interface/sim_params.py`` (docs/parameters.md). ``target`` ([x, y] in metres; settable
live, ``ros2 param set /sim target "[0.1, 0.15]"`` or a tree's ``SetParameter``) moves the target at
once, before the answer, without publishing, so the next command's observation shows it (a reset
draws a new target from ``seed``).

Modes (parameter ``mode``):
- ``lockstep``: every command advances the physics by one control period and
  the new observation is published right away: the closed loop is exactly
  replayable whatever the machine's load (a sample is never skipped or repeated).
- ``realtime``: a timer at ``control_rate_hz`` steps with the latest command and publishes.

Services (``flashrt_ros/Reset``, ``Snapshot`` and ``Restore`` with ``name``; a copy
under the same ``request_id`` gets the first answer, ``ros/request_ledger.py``): ``~/reset`` re-seeds the episode (``seed``) and publishes its
first observation; ``~/snapshot`` keeps the exact physics state
(``mj_getState``, ``mjSTATE_INTEGRATION``) under a name; ``~/restore`` puts it
back (``mj_setState``) without publishing, or, with ``publish_on_restore``, publishes
the restored observation (a behaviour tree that restores the world and the policy
then resumes on exactly the observation the snapshot saw). All physics calls hold one lock.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from typing import Any

import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Bool, Float32MultiArray, Float64, Float64MultiArray, UInt64

from flashrt_ros.interface.errors import ErrorCode
from flashrt_ros.interface.sim_params import SIM_PARAMS, SimConfig
from flashrt_ros.ros.parameters import declare_parameters, read_config, refuse_invalid_sets
from flashrt_ros.ros.spinning import serve_until_interrupted
from flashrt_ros.ros.request_ledger import RequestLedger, answer_once
from flashrt_ros.srv import Reset, Restore, Snapshot

#: How long a copy of a request waits for the first one's answer (s): a physics call takes milliseconds.
COPY_WAIT_S = 10.0


class SimNode(Node):
    """Publishes the arm's camera and joints, applies commands, keeps physics snapshots."""

    def __init__(self, node_name: str = "sim", **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        from flashrt_ros.sim.arm import JOINTS, ArmConfig, ArmSim
        from flashrt_ros.sim.arm_task import ReachCriterion
        declare_parameters(self, SIM_PARAMS)
        p = read_config(self, SimConfig)           # ValueError naming a bad value
        self.mode, self.joints = p.mode, list(JOINTS)
        self.sim = ArmSim(ArmConfig(control_period_s=1.0 / p.control_rate_hz, render=p.render,
                                    image_width=p.image_width, image_height=p.image_height),
                          seed=p.seed)
        self._lock = threading.Lock()
        self._snapshots: dict[str, Any] = {}
        self._command: list[float] | None = None
        self.step_times_s: list[float] = []        # wall time of each physics+render+publish step
        reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        # The observation is latched: in lock-step nothing is published until a command comes, so a
        # reader that matched after the last publish (a node started, or still discovering the sim on
        # a loaded machine) would otherwise wait for good; a transient-local reader gets the latest one.
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self._joint_pub = self.create_publisher(JointState, "~/joint_states", latched)
        self._image_pub = self.create_publisher(Image, "~/image", latched)
        self._target_pub = self.create_publisher(Float32MultiArray, "~/target", latched)
        self._steps_pub = self.create_publisher(UInt64, "~/steps", latched)
        self._distance_pub = self.create_publisher(Float64, "~/distance", latched)
        self._reached_pub = self.create_publisher(Bool, "~/reached", latched)
        self._criterion = ReachCriterion()
        self.create_subscription(Float64MultiArray, "~/command", self._on_command, reliable)
        self.add_on_set_parameters_callback(refuse_invalid_sets(SIM_PARAMS))
        self.add_on_set_parameters_callback(self._check_target)
        self.add_post_set_parameters_callback(self._apply_target)
        self._ledger = RequestLedger()        # a copy of a request (same request_id) gets the first answer
        for srv, name, run in ((Reset, "reset", self._reset), (Snapshot, "snapshot", self._snapshot),
                               (Restore, "restore", self._restore)):
            self.create_service(srv, f"~/{name}", lambda req, resp, n=name, r=run: answer_once(
                self._ledger, n, req, resp, r, COPY_WAIT_S, self.get_logger()))
        if self.mode == "realtime":
            self.create_timer(1.0 / p.control_rate_hz, self._on_timer)
        self.get_logger().info(f"sim ready: {self.mode}, seed {p.seed}, "
                               f"{p.image_width}x{p.image_height} camera"
                               f"{'' if p.render else ' (off)'}")

    # --- the loop --------------------------------------------------------------
    def _on_command(self, msg: Float64MultiArray) -> None:
        values = list(msg.data)
        if len(values) != len(self.joints):
            self.get_logger().error(f"command needs {len(self.joints)} values, got {len(values)}",
                                    throttle_duration_sec=1.0)
            return
        if self.mode == "lockstep":
            self._advance(values)
        else:
            self._command = values

    def _check_target(self, params: list[Parameter]) -> SetParametersResult:
        for param in params:
            if param.name == "target":
                values = list(param.value or [])
                if len(values) != 2 or not all(math.isfinite(v) for v in values):
                    return SetParametersResult(successful=False, reason="target must be [x, y] in metres, "
                                                                       f"2 finite numbers (got {values})")
        return SetParametersResult(successful=True)

    def _apply_target(self, params: list[Parameter]) -> None:
        for param in params:
            if param.name == "target":
                with self._lock:
                    self.sim.set_target(list(param.value))

    def _on_timer(self) -> None:
        self._advance(self._command)

    def _advance(self, command: list[float] | None) -> None:
        t0 = time.perf_counter()
        with self._lock:
            try:
                if command is not None:
                    self.sim.step(command)
            except ValueError as exc:
                self.get_logger().error(str(exc), throttle_duration_sec=1.0)
                return
            self._publish_observation()
        self.step_times_s.append(time.perf_counter() - t0)

    def _publish_observation(self) -> None:
        stamp = self.get_clock().now().to_msg()
        if self.sim.cfg.render:
            pixels = self.sim.render()
            img = Image(height=pixels.shape[0], width=pixels.shape[1], encoding="rgb8",
                        is_bigendian=0, step=pixels.shape[1] * 3, data=pixels.tobytes())
            img.header.stamp, img.header.frame_id = stamp, "overhead"
            self._image_pub.publish(img)
        self._target_pub.publish(Float32MultiArray(data=self.sim.target_xy().tolist()))
        js = JointState(name=self.joints, position=self.sim.joint_positions().tolist(),
                        velocity=self.sim.joint_velocities().tolist())
        js.header.stamp = stamp
        self._steps_pub.publish(UInt64(data=self.sim.steps))
        self._distance_pub.publish(Float64(data=self.sim.distance_to_target()))
        self._reached_pub.publish(Bool(data=self._criterion.reached(
            self.sim.tip_xy(), self.sim.target_xy(), self.sim.joint_velocities())))
        self._joint_pub.publish(js)

    # --- services ----------------------------------------------------------------
    def _reset(self, request: Any, response: Any) -> Any:
        with self._lock:
            self.sim.reset(read_config(self, SimConfig).seed)
            self._command = None
            self._publish_observation()
        response.success, response.message = True, "episode reset; first observation published"
        return response

    def _snapshot(self, request: Any, response: Any) -> Any:
        with self._lock:
            self._snapshots[request.name] = self.sim.get_state()
            response.capsule.name, response.capsule.position = request.name, self.sim.steps
        response.success, response.message = True, f"physics state {request.name} at step {self.sim.steps}"
        return response

    def _restore(self, request: Any, response: Any) -> Any:
        with self._lock:
            state = self._snapshots.get(request.name)
            if state is None:
                response.success, response.error_code = False, int(ErrorCode.NOT_FOUND)
                response.message = f"no physics snapshot named {request.name!r}"
                return response
            self.sim.set_state(state)
            response.capsule.name, response.capsule.position = request.name, self.sim.steps
            if read_config(self, SimConfig).publish_on_restore:
                self._publish_observation()
        response.success, response.message = True, f"physics restored to {request.name} (step {self.sim.steps})"
        return response

    def destroy_node(self) -> None:
        self.sim.close()
        super().destroy_node()


def main(argv: list[str] | None = None) -> int:
    rclpy.init(args=argv if argv is not None else sys.argv)
    serve_until_interrupted(SimNode(), num_threads=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
