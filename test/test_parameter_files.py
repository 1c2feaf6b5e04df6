"""Each node parameter is declared once (``ros/parameters.py`` PARAMS, ``ros/robot_io_params.py``
ROBOT_IO_PARAMS): the YAML files that repeat values hold only declared parameters with values of
the declared type, choices and range, and the node declares nothing outside the two tables."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flashrt_ros.ros.parameters import PARAMS, ParamDef, check_value
from flashrt_ros.ros.robot_io_params import ROBOT_IO_PARAMS

REPO = Path(__file__).resolve().parents[1]
DECLARED: dict[str, ParamDef] = {p.name: p for p in (*PARAMS, *ROBOT_IO_PARAMS)}
PARAMETER_FILES = sorted((REPO / "config").glob("*.yaml")) + [REPO / "test" / "params_tiny_llm.yaml"]


def file_parameters(path: Path) -> dict[str, object]:
    """The ``ros__parameters`` of every node key in a ROS parameter file, merged."""
    out: dict[str, object] = {}
    for section in yaml.safe_load(path.read_text()).values():
        out.update(section["ros__parameters"])
    return out


def test_the_config_files_are_all_checked():
    assert {p.name for p in PARAMETER_FILES} >= {"llm.yaml", "policy.yaml", "arm_demo.yaml"}


@pytest.mark.parametrize("path", PARAMETER_FILES, ids=lambda p: p.name)
def test_every_key_of_a_parameter_file_is_declared_with_a_valid_value(path):
    values = file_parameters(path)
    assert values, f"{path.name}: no ros__parameters"
    undeclared = sorted(set(values) - set(DECLARED))
    assert not undeclared, f"{path.name} sets parameters no table declares: {undeclared}"
    problems = [reason for name, value in values.items() if (reason := check_value(DECLARED[name], value))]
    assert not problems, f"{path.name}: {problems}"


@pytest.mark.parametrize("name,value,fragment", [
    ("max_context", 8, "must be in 16..262144"),
    ("control_rate_hz", 50, "must be a float"),       # rclpy refuses an integer for a double
    ("autostart", 1, "must be a bool"),
    ("default_tier", "moon", "must be one of device, host, disk"),
    ("input_joint_names", ["a", 3], "must be a list of str"),
])
def test_check_value_refuses_what_the_declaration_rules_out(name, value, fragment):
    assert fragment in (check_value(DECLARED[name], value) or "")


def test_the_node_declares_exactly_the_tables():
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node

    from flashrt_ros.ros.node import FlashRTNode
    context = Context()
    rclpy.init(context=context, args=[])
    try:
        plain, node = Node("plain", context=context), FlashRTNode(context=context)
        try:
            rclpy_own = set(plain.get_parameters_by_prefix(""))      # use_sim_time, ...
            assert set(node.get_parameters_by_prefix("")) - rclpy_own == set(DECLARED)
        finally:
            node.destroy_node()
            plain.destroy_node()
    finally:
        rclpy.shutdown(context=context)
