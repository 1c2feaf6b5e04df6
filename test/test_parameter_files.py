"""Each node parameter is declared once (``interface/node_params.py`` PARAMS,
``interface/robot_io_params.py`` ROBOT_IO_PARAMS): the YAML files that repeat values hold only declared parameters with values of
the declared type, choices and range, and the node declares nothing outside the two tables."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flashrt_ros.interface.node_params import PARAMS
from flashrt_ros.interface.parameters import ParamDef, check_value
from flashrt_ros.interface.robot_io_params import ROBOT_IO_PARAMS

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


def test_the_typed_configs_are_the_tables_with_their_types():
    import dataclasses

    from flashrt_ros.interface.node_params import NodeConfig
    from flashrt_ros.interface.parameters import config_from
    from flashrt_ros.interface.robot_io_params import RobotIOConfig
    from flashrt_ros.interface.sim_params import SIM_PARAMS, SimConfig
    for cls, table in ((NodeConfig, PARAMS), (RobotIOConfig, ROBOT_IO_PARAMS), (SimConfig, SIM_PARAMS)):
        assert [(f.name, f.type) for f in dataclasses.fields(cls)] == [(p.name, p.field_type) for p in table]
    defaults = {p.name: p.default for p in PARAMS}
    assert config_from(NodeConfig, defaults) == NodeConfig(**defaults)
    with pytest.raises(ValueError, match="control_rate_hz must be a float"):
        config_from(NodeConfig, {**defaults, "control_rate_hz": 50})
    with pytest.raises(ValueError, match="default_tier must be one of device, host, disk"):
        config_from(NodeConfig, {**defaults, "default_tier": "moon"})
    assert config_from(NodeConfig, {**defaults, "default_tier": "moon"}, check=False).default_tier == "moon"
    assert RobotIOConfig().hold_command == () and RobotIOConfig().input_joint_fields == ("position",)


def test_control_rate_hz_is_declared_once_for_the_node_and_the_simulator():
    from flashrt_ros.interface.sim_params import SIM_PARAMS
    node, sim = DECLARED["control_rate_hz"], next(p for p in SIM_PARAMS if p.name == "control_rate_hz")
    assert (sim.default, sim.float_range, sim.read_only) == (node.default, node.float_range, node.read_only)


def test_no_parameter_is_read_by_its_name_outside_the_declarations():
    """Code reads typed configs (``config.default_tier``); ``ros/parameters.read_config`` is the one
    place that asks a node for a parameter by name."""
    readers = [str(p.relative_to(REPO)) for p in (REPO / "flashrt_ros").rglob("*.py")
               if ".get_parameter(" in p.read_text()]
    assert readers == ["flashrt_ros/ros/parameters.py"]


def test_the_simulator_declares_exactly_its_table(monkeypatch):
    pytest.importorskip("mujoco", reason="the simulator needs MuJoCo (requirements-sim.txt)")
    import rclpy
    from rclpy.context import Context
    from rclpy.node import Node

    from flashrt_ros.interface.sim_params import SIM_PARAMS
    from flashrt_ros.sim.node import SimNode
    monkeypatch.setenv("MUJOCO_GL", "egl")
    context = Context()
    rclpy.init(context=context, args=[])
    try:
        plain = Node("plain", context=context)
        sim = SimNode("sim_params_probe", context=context,
                      parameter_overrides=[rclpy.parameter.Parameter("render", value=False)])
        try:
            rclpy_own = set(plain.get_parameters_by_prefix(""))
            assert set(sim.get_parameters_by_prefix("")) - rclpy_own == {p.name for p in SIM_PARAMS}
            refused = sim.set_parameters([rclpy.parameter.Parameter("mode", value="realtime")])[0]
            assert not refused.successful and "read-only" in refused.reason
        finally:
            sim.destroy_node()
            plain.destroy_node()
    finally:
        rclpy.shutdown(context=context)
