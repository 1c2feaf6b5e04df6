"""One BehaviorTree.CPP tree, two nodes: the MuJoCo arm (``/sim``) and the trained ACT policy node.

The shipped trees ``restore_world_and_policy.xml`` and ``fork_two_targets.xml`` run through
``flashrt bt run`` / ``FlashRTTrees`` against a lock-step simulator (``publish_on_restore``)
and a policy node in ``run_mode: goal`` whose commands go straight to ``/sim/command``
(``inputs_after_restore: discard``), subscribed transient local so that the sim's latched
observation reaches it even if it matched the sim after the reset. What they prove: restoring the world and the policy
together repeats a stretch bit for bit, and two tries forked from one saved moment start
from exactly the same state.
"""
from __future__ import annotations

import os
import threading

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")
pytest.importorskip("mujoco", reason="mujoco is not installed (scripts/setup_sim.sh installs it)")
bt = pytest.importorskip("behaviortreepy", reason="behaviortreepy has wheels for x86_64 Linux only")

from node_fixtures import ros_node  # noqa: E402,F401 - fixture
from rosproc import NodeUnderTest, start_python, stop, wait_for_text  # noqa: E402
from waiting import wait_until  # noqa: E402
from flashrt_ros.bt.btcpp import FlashRTTrees  # noqa: E402
from flashrt_ros.bt.run import TREES_DIR, fill_blackboard  # noqa: E402

APPROACH, TRY = 20, 30


def _policy_params(capsule_dir: str) -> dict[str, str]:
    from flashrt_ros.sim.arm_policy import TRAINED
    return {"engine_kind": "policy", "device": "cpu", "policy": f"lerobot:{TRAINED['act']}",
            "input_environment_state_topic": "/sim/target", "control_rate_hz": "50.0",
            "control_trigger": "inputs", "input_state_topic": "''", "input_joint_state_topic": "/sim/joint_states",
            "input_joint_names": "[shoulder, elbow]", "input_joint_fields": "[position, velocity]",
            "qos_reliability": "reliable", "qos_depth": "1", "qos_durability": "transient_local",
            "max_observation_age_s": "60.0",
            "output_type": "float64_array", "output_topic": "/sim/command", "output_joint_names": "[shoulder, elbow]",
            "run_mode": "goal", "inputs_after_restore": "discard", "capsule_directory": capsule_dir}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(sim process, policy node): the arm in lock-step and the trained ACT policy driving it."""
    tmp = tmp_path_factory.mktemp("world")
    sim_log = tmp / "sim.log"
    sim = start_python(["-m", "flashrt_ros.sim.node", "--ros-args", "-p", "render:=false",
                        "-p", "publish_on_restore:=true", "-p", "seed:=1"], sim_log)
    policy = None
    try:
        assert wait_for_text(sim_log, "sim ready", 120, sim), sim_log.read_text()
        policy = NodeUnderTest(tmp, "arm", _policy_params(str(tmp / "capsules")))
        policy.wait_active()
        yield sim, policy
    finally:
        if policy is not None:
            assert policy.stop() == 0, policy.log.read_text()
        assert stop(sim) == 0, sim_log.read_text()


class Commands:
    """Every command that reaches ``/sim/command``, as bytes (bit-exact comparison)."""

    def __init__(self, node) -> None:
        import numpy as np
        from std_msgs.msg import Float64MultiArray
        self._np, self.sent, self._lock = np, [], threading.Lock()
        self._sub = node.create_subscription(Float64MultiArray, "/sim/command", self._on, 1000)

    def _on(self, msg) -> None:
        with self._lock:
            self.sent.append(self._np.asarray(msg.data, dtype=self._np.float64).tobytes())

    def snapshot(self) -> list[bytes]:
        with self._lock:
            return list(self.sent)


def run_library_tree(ros_node, name: str, entries: list[str], timeout_s: float = 300.0):  # noqa: F811
    """Tick a library tree with the Python API (the policy node is the tree's default node)."""
    from flashrt_ros.client import FlashRTClient
    events: list[tuple[str, str, str]] = []
    trees = FlashRTTrees(FlashRTClient(ros_node, "/arm/flashrt"), on_event=lambda *e: events.append(e))
    xml = trees.prepare((TREES_DIR / name).read_text())
    wait_until(lambda: not trees.subscribe_topics(), 60, "the topics the tree reads")   # as bt run does
    bb = bt.Blackboard.create()
    fill_blackboard(bb, entries, trees.unsigned_keys)
    tree = trees.factory.create_tree_from_text(xml, bb)
    status = [bt.NodeStatus.RUNNING]

    def ticked() -> bool:
        status[0] = tree.tick_once()
        return status[0] != bt.NodeStatus.RUNNING
    wait_until(ticked, timeout_s, f"{name} to end", poll_s=0.01)
    return status[0], bb, events, trees


def test_restoring_world_and_policy_repeats_the_stretch_bit_for_bit(world, ros_node):  # noqa: F811
    commands = Commands(ros_node)
    status, bb, events, trees = run_library_tree(ros_node, "restore_world_and_policy.xml",
                                                 [f"approach_steps:={APPROACH}", f"try_steps:={TRY}"])
    assert status == bt.NodeStatus.SUCCESS, events
    assert trees.nodes_used == {"/sim": {"reset", "snapshot", "restore"},
                                "/arm/flashrt": {"reset", "run_policy", "snapshot", "restore"}}
    sent = wait_until(lambda: (c := commands.snapshot()) and len(c) >= APPROACH + 2 * TRY and c, 60, "the commands")
    assert len(sent) == APPROACH + 2 * TRY, "one command per policy step, none lost or repeated"
    first, second = sent[APPROACH:APPROACH + TRY], sent[APPROACH + TRY:]
    assert first == second, "the second try differs from the first"
    assert len(set(first)) > 1, "the arm moved during the try"
    assert bb.get_string("first_end") == bb.get_string("second_end") == str(APPROACH + TRY)


def test_forking_to_two_targets_tries_both_from_one_state_and_keeps_the_nearer(world, ros_node):  # noqa: F811
    commands = Commands(ros_node)
    status, bb, events, _ = run_library_tree(ros_node, "fork_two_targets.xml", [
        f"approach_steps:={APPROACH}", f"try_steps:={TRY}", "target_a:=[0.12, 0.12]", "target_b:=[-0.15, 0.05]"])
    assert status == bt.NodeStatus.SUCCESS, events
    sent = wait_until(lambda: (c := commands.snapshot()) and len(c) >= APPROACH + 2 * TRY and c, 60, "the commands")
    try_a, try_b = sent[APPROACH:APPROACH + TRY], sent[APPROACH + TRY:APPROACH + 2 * TRY]
    assert try_a[0] == try_b[0], "both tries start from the same saved world and policy"
    assert try_a != try_b, "different targets lead elsewhere"
    a, b = bb.get_double("distance_a"), bb.get_double("distance_b")
    assert a > 0 and b > 0 and bb.get_string("kept") == ("a" if a < b else "b")
