"""A py_trees tree interrupts a GR00T N1.5 policy node and resumes it: the same actions after the restore.

The node (a subprocess, ``run_mode: goal``) loads the tiny GR00T checkpoint LeRobot wrote
(``test/groot_reference``) with ``policy:=lerobot:<dir>`` and reads a state topic and two camera
topics. The feeds publish one constant state and one constant frame per camera, so an action depends
only on the policy's state: the queue, the encoded observation, the prompt and the noise counter. The
uninterrupted episode runs ``STEPS`` steps from a reset (saved as a capsule) in two RunPolicy goals, split
where the interrupted one is (a goal's end drops a chunk planned beside the loop: ``replan: async``); the
interrupted one restores that start, runs ``BEFORE`` steps, snapshots, does other work (a reset, whose
new seed draws other noise, and ``OTHER`` steps), restores and runs the rest. Its actions before the snapshot
and after the restore must equal the uninterrupted episode's bit for bit (float32 on the wire, compared exactly).
"""
from __future__ import annotations

import threading
import time

import py_trees
import pytest
from py_trees.common import Status

pytest.importorskip("rclpy")

from node_fixtures import active_node, client_of, ros_node  # noqa: E402,F401 - fixture
from waiting import wait_until  # noqa: E402
from flashrt_ros.bt import Reset, Restore, RunPolicy, Snapshot  # noqa: E402

NAME = "groot_tree"
STEPS, BEFORE, OTHER = 20, 7, 9          # the tiny case plans 8 actions a replan: the snapshot is mid-chunk
TASK = "pick up the red cube"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from groot_reference import Case, run_reference
    root = tmp_path_factory.mktemp("groot_tree")
    case = Case(directory=str(root / "ckpt"), attn="sdpa", n_action_steps=8, steps=1, task=TASK)
    run_reference([case], root / "spec")
    return case


class Feeds:
    """A constant state and one constant rgb8 frame per camera, published at ~50 Hz from a thread."""

    def __init__(self, ros_node, case) -> None:
        from sensor_msgs.msg import Image
        from std_msgs.msg import Float32MultiArray
        h, w = case.hw
        self._messages = [(ros_node.create_publisher(Float32MultiArray, f"/{NAME}/state", 10),
                           Float32MultiArray(data=[0.1 * i - 0.2 for i in range(case.state)]))]
        for cam in range(case.cameras):
            pixels = bytes((7 * i + 31 * cam) % 256 for i in range(h * w * 3))
            self._messages.append((ros_node.create_publisher(Image, f"/{NAME}/cam{cam}", 10),
                                   Image(height=h, width=w, encoding="rgb8", step=w * 3, data=pixels)))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for pub, msg in self._messages:
                pub.publish(msg)

    def close(self, ros_node) -> None:
        self._stop.set()
        self._thread.join(5)
        for pub, _ in self._messages:
            ros_node.destroy_publisher(pub)


class Actions:
    """Every command the node publishes, in order."""

    def __init__(self, ros_node, topic: str) -> None:
        from std_msgs.msg import Float32MultiArray
        self._lock, self._actions = threading.Lock(), []
        self.sub = ros_node.create_subscription(Float32MultiArray, topic, self._on, 1000)

    def _on(self, msg) -> None:
        with self._lock:
            self._actions.append(list(msg.data))

    def since(self, start: int) -> list[list[float]]:
        with self._lock:
            return self._actions[start:]

    def __len__(self) -> int:
        with self._lock:
            return len(self._actions)


@pytest.fixture(scope="module", params=["sync", "async"])
def groot_node(checkpoint, tmp_path_factory, ros_node, request):  # noqa: F811
    """``replan`` sync, or async with ``replan_late: wait`` (a plan merged two steps after its launch, exactly:
    the schedule, not the machine's speed, decides which chunk an action comes from)."""
    params = {"replan": request.param, "replan_late": "wait", "replan_delay_steps": "2",
              "engine_kind": "policy", "policy": f"lerobot:{checkpoint.directory}", "policy_instruction": TASK,
              "device": "cpu", "run_mode": "goal", "qos_deadline_factor": "0.0", "control_rate_hz": "20.0",
              "input_state_topic": f"/{NAME}/state",
              "input_image_topics": f"[/{NAME}/cam0, /{NAME}/cam1]",
              "max_observation_age_s": "60.0", "goal_stale_timeout_s": "0.0"}
    with active_node(tmp_path_factory.mktemp(NAME), NAME, params) as node:
        feeds = Feeds(ros_node, checkpoint)
        actions = Actions(ros_node, f"{node.namespace}/flashrt/action")
        client = client_of(node, ros_node)
        wait_until(lambda: client.run_policy_ready() and client.wait_for("snapshot", 0.0), 120, "the node's servers")
        wait_until(lambda: actions.sub.get_publisher_count() > 0, 60, "the command publisher matched")
        try:
            yield client, actions
        finally:
            feeds.close(ros_node)
            ros_node.destroy_subscription(actions.sub)


def tick_to_end(root: py_trees.behaviour.Behaviour, timeout_s: float = 300.0) -> None:
    """Tick at ~100 Hz until the root finished; a condition deadline generous for a loaded 2-core machine."""
    deadline = time.monotonic() + timeout_s
    root.tick_once()
    while root.status is Status.RUNNING and time.monotonic() < deadline:
        time.sleep(0.01)
        root.tick_once()
    assert root.status is Status.SUCCESS, [(b.name, b.status, b.feedback_message) for b in root.iterate()]


def episode(client, actions: Actions, *children: py_trees.behaviour.Behaviour) -> list[list[float]]:
    """Tick ``children`` in a sequence; the commands they published, once all have arrived."""
    start = len(actions)
    tick_to_end(py_trees.composites.Sequence("episode", memory=True, children=list(children)))
    steps = sum(b.result.steps for b in children if isinstance(b, RunPolicy))
    wait_until(lambda: len(actions) >= start + steps, 60, f"{steps} commands at the topic")
    return actions.since(start)


def test_a_tree_interrupts_and_resumes_groot_with_the_same_actions(groot_node):
    client, actions = groot_node
    uninterrupted = episode(client, actions, Reset("new episode", client),         # a seed from the OS
                            Snapshot("save start", client, "groot_start", overwrite=True),
                            RunPolicy("drive", client, max_steps=BEFORE),
                            RunPolicy("drive on", client, max_steps=STEPS - BEFORE))
    assert len(uninterrupted) == STEPS
    interrupted = episode(client, actions, Restore("same episode", client, "groot_start"),
                          RunPolicy("drive", client, max_steps=BEFORE),
                          Snapshot("save", client, "groot_mid", overwrite=True),
                          Reset("other episode", client),                          # another seed
                          RunPolicy("other work", client, max_steps=OTHER),
                          Restore("resume", client, "groot_mid"),
                          RunPolicy("drive on", client, max_steps=STEPS - BEFORE))
    assert len(interrupted) == STEPS + OTHER
    # the other episode drew other noise: without the restore the actions would go on differing
    assert interrupted[BEFORE:BEFORE + OTHER] != uninterrupted[BEFORE:BEFORE + OTHER]
    resumed = interrupted[:BEFORE] + interrupted[BEFORE + OTHER:]
    assert resumed == uninterrupted, "the restored GR00T policy did not repeat its actions"
