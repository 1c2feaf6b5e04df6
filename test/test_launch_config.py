"""The launch files' parameters reach namespaced and renamed nodes; autostart activates once.

The parameter checks use rcl's own parameter-file rules (an rclpy node given
``--params-file``, a namespace and a name), so they run without ROS 2 launch. The
event-handler checks go through the launch description and skip where launch_ros is
not importable (bare machine); test_launch.py starts the launch file for real there.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import rclpy
from rclpy.context import Context
from rclpy.node import Node

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"llm": "llm", "policy": "policy"}   # config file stem -> engine_kind it sets


def parameters_seen_by(config: Path, name: str, namespace: str) -> dict[str, object]:
    """The parameter overrides rcl gives node `namespace/name` started with `config`."""
    context = Context()
    rclpy.init(context=context, args=[])
    try:
        node = Node(name, namespace=namespace, context=context,
                    cli_args=["--ros-args", "--params-file", str(config)],
                    automatically_declare_parameters_from_overrides=True)
        try:
            return {name: p.value for name, p in node.get_parameters_by_prefix("").items()}
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


@pytest.mark.parametrize("stem", sorted(CONFIGS))
@pytest.mark.parametrize("name,namespace", [("flashrt", ""), ("flashrt", "robot1"),
                                            ("arm_policy", "/fleet/robot2")])
def test_config_parameters_reach_namespaced_and_renamed_nodes(stem: str, name: str,
                                                              namespace: str) -> None:
    params = parameters_seen_by(ROOT / "config" / f"{stem}.yaml", name, namespace)
    assert params.get("engine_kind") == CONFIGS[stem], (
        f"config/{stem}.yaml did not reach node {namespace}/{name}: {sorted(params)}")


def test_a_node_keyed_file_would_miss_the_namespaced_node(tmp_path: Path) -> None:
    """The regression the `/**` key fixes: `flashrt:` matches only /flashrt."""
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text("flashrt:\n  ros__parameters:\n    engine_kind: policy\n")
    assert parameters_seen_by(keyed, "flashrt", "")["engine_kind"] == "policy"
    assert "engine_kind" not in parameters_seen_by(keyed, "flashrt", "robot1")


# --- through the launch description (needs launch_ros) ----------------------------

def _launch_description(stem: str):
    pytest.importorskip("launch_ros", reason="launch_ros is not installed (not on PyPI); "
                        "runs on a ROS 2 distro")
    path = ROOT / "launch" / f"flashrt_{stem}.launch.py"
    spec = importlib.util.spec_from_file_location(f"flashrt_{stem}_launch", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.generate_launch_description()


def _transition(node, start: str, goal: str):
    from launch_ros.events.lifecycle import StateTransition
    from lifecycle_msgs.msg import TransitionEvent
    msg = TransitionEvent()
    msg.start_state.label = start
    msg.goal_state.label = goal
    return StateTransition(action=node, msg=msg)


@pytest.mark.parametrize("stem", sorted(CONFIGS))
def test_autostart_activates_after_configure_but_not_after_a_manual_deactivate(stem: str) -> None:
    description = _launch_description(stem)
    from launch.actions import RegisterEventHandler
    from launch_ros.actions import LifecycleNode
    nodes = [e for e in description.entities if isinstance(e, LifecycleNode)]
    handlers = [e.event_handler for e in description.entities
                if isinstance(e, RegisterEventHandler)]
    assert len(nodes) == 1 and len(handlers) == 1
    node, handler = nodes[0], handlers[0]
    assert handler.matches(_transition(node, "configuring", "inactive"))
    assert not handler.matches(_transition(node, "deactivating", "inactive"))
    assert not handler.matches(_transition(node, "activating", "active"))


@pytest.mark.parametrize("stem", sorted(CONFIGS))
def test_launch_defaults_to_this_packages_config_file(stem: str) -> None:
    description = _launch_description(stem)
    from launch import LaunchContext
    from launch.actions import DeclareLaunchArgument
    from launch.utilities import perform_substitutions
    args = {e.name: e for e in description.entities if isinstance(e, DeclareLaunchArgument)}
    assert {"params_file", "namespace", "autostart"} <= set(args)
    default = perform_substitutions(LaunchContext(), args["params_file"].default_value)
    assert Path(default).parts[-2:] == ("config", f"{stem}.yaml")
