"""The parameter declarations on a ROS node: descriptors, declaring, refusing a bad set, reading.

The tables and the checks are the contract's (``flashrt_ros/interface/parameters.py`` and its
tables); this module binds them to an rclpy node. ``read_config`` is the one place that reads a
parameter by its name: the node, the action servers and the simulator read typed configs.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor,
                                ParameterType, SetParametersResult)
from rclpy.exceptions import ParameterUninitializedException
from rclpy.parameter import Parameter

from flashrt_ros.interface.parameters import ParamDef, config_from, first_problem

_ROS_TYPES = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
              float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING}
_ROS_ARRAY_TYPES = {str: ParameterType.PARAMETER_STRING_ARRAY, float: ParameterType.PARAMETER_DOUBLE_ARRAY}


def descriptor(p: ParamDef) -> ParameterDescriptor:
    type_ = _ROS_ARRAY_TYPES[p.array_of] if p.array_of is not None else _ROS_TYPES[p.kind]
    d = ParameterDescriptor(name=p.name, type=type_, description=p.description, read_only=p.read_only)
    if p.choices:
        d.additional_constraints = "one of: " + ", ".join(p.choices)
    if p.int_range:
        d.integer_range = [IntegerRange(from_value=p.int_range[0], to_value=p.int_range[1], step=1)]
    if p.float_range:
        d.floating_point_range = [FloatingPointRange(from_value=p.float_range[0],
                                                     to_value=p.float_range[1], step=0.0)]
    return d


def declare_parameters(node: Any, params: Iterable[ParamDef]) -> None:
    """Declare each with its descriptor; an array with an empty default is declared by type (rclpy
    cannot infer the type of ``[]``), and reads as unset until a value is given."""
    for p in params:
        if p.array_of is not None and not p.default:
            node.declare_parameter(p.name, Parameter.Type.STRING_ARRAY if p.array_of is str
                                   else Parameter.Type.DOUBLE_ARRAY, descriptor(p))
        else:
            node.declare_parameter(p.name, p.default, descriptor(p))


def refuse_invalid_sets(params: Iterable[ParamDef]) -> Callable[[list], SetParametersResult]:
    """A set-parameters callback that refuses, with the reason, a value ``check_value`` refuses
    (rclpy has already checked types, ranges and read-only against the descriptors)."""
    by_name = {p.name: p for p in params}

    def callback(changed: list) -> SetParametersResult:
        reason = first_problem(by_name.values(), {c.name: c.value for c in changed if c.name in by_name})
        return SetParametersResult(successful=reason is None, reason=reason or "")
    return callback


def read_config(node: Any, cls: type, *, check: bool = True) -> Any:
    """The node's current values of ``cls``'s table as a ``cls`` (``interface.parameters.config_class``):
    an unset array reads as empty; ``check`` refuses a bad value with ``ValueError`` (see ``config_from``)."""
    values: dict[str, Any] = {}
    for p in cls.PARAMS:
        try:
            values[p.name] = node.get_parameter(p.name).value
        except ParameterUninitializedException:      # an array declared by type and never set
            values[p.name] = None
    return config_from(cls, values, check=check)
