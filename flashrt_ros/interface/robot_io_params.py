"""The policy node's robot I/O parameters (policy topics, QoS, stale-data stop, RunPolicy, rollback):
``ROBOT_IO_PARAMS`` and its typed config ``RobotIOConfig``. See ``parameters``.

Why a second table beside ``node_params.PARAMS``: these are read when the policy loop starts
(activate), several are string/number arrays, and they belong to one concept (what the policy
node reads and writes on the robot's topics). The node declares them all at start-up so ``-p``
overrides and YAML files apply.
"""
from __future__ import annotations

from flashrt_ros.interface.parameters import ParamDef, config_class

OUTPUT_TYPES = ("float32_array", "float64_array", "joint_state", "joint_trajectory")

ROBOT_IO_PARAMS: tuple[ParamDef, ...] = (
    ParamDef("input_state_topic", "~/observation", "std_msgs/Float32MultiArray feeding "
             "observation.state (ignored when input_joint_state_topic is set; empty = none).", True),
    ParamDef("input_joint_state_topic", "", "sensor_msgs/JointState feeding observation.state "
             "(empty = none).", True),
    ParamDef("input_joint_names", [], "Joints (in policy order) taken from the JointState; a "
             "listed joint missing from a message is an error.", True, array_of=str),
    ParamDef("input_joint_fields", ["position"], "JointState fields concatenated into "
             "observation.state, field-major (position, velocity, effort).", True, array_of=str),
    ParamDef("input_environment_state_topic", "", "std_msgs/Float32MultiArray feeding "
             "observation.environment_state (e.g. a task target; empty = none).", True),
    ParamDef("input_image_topics", [], "Camera topics: sensor_msgs/Image (rgb8, bgr8, rgba8, bgra8, "
             "mono8, mono16, yuv422_yuy2/yuyv, uyvy/yuv422), or sensor_msgs/CompressedImage (JPEG/PNG) "
             "for a topic ending in /compressed; resized (aspect kept) and centre-cropped to the "
             "policy's image feature.", True, array_of=str),
    ParamDef("input_image_features", [], "Policy feature per image topic (default "
             "observation.images.<last topic segment>, /compressed not counted).", True, array_of=str),
    ParamDef("qos_reliability", "best_effort", "Reliability of the input subscriptions: best_effort "
             "(sensor-data profile: matches every publisher) or reliable.", True,
             choices=("best_effort", "reliable")),
    ParamDef("qos_history", "keep_last", "History of the input subscriptions (depth: qos_depth).",
             True, choices=("keep_last", "keep_all")),
    ParamDef("qos_durability", "volatile", "Durability of the input subscriptions.", True,
             choices=("volatile", "transient_local")),
    ParamDef("output_qos_reliability", "reliable", "Reliability of the command publisher "
             "(reliable reaches reliable and best-effort subscribers).", True,
             choices=("best_effort", "reliable")),
    ParamDef("output_qos_depth", 10, "History depth of the command publisher.", True,
             int_range=(1, 1000)),
    ParamDef("max_observation_age_s", 0.0, "An input older than this stops the policy (0 = derived per "
             "input: 2.5 control periods, or 2.5 of the input's measured period when longer; /diagnostics "
             "reports it).", True, float_range=(0.0, 3600.0)),
    ParamDef("max_observation_age_ceiling_s", 0.5, "No derived input age limit (max_observation_age_s 0) exceeds "
             "this: an input slowing down (a camera degrading from 30 to 1 Hz) stops the policy instead of "
             "stretching its limit. Must be at least 2.5 control periods; raise it for slow sensors.", True,
             float_range=(0.001, 3600.0)),
    ParamDef("sync_tolerance_s", 0.0, "Largest spread of the stamps of one tick's inputs (header "
             "stamp, else receipt time; 0 = no check).", True, float_range=(0.0, 3600.0)),
    ParamDef("hold_command", [], "Command published on every stale tick (empty = publish "
             "nothing).", True, array_of=float),
    ParamDef("control_thread_priority", 50, "control_trigger timer: the control loop's own thread runs "
             "SCHED_FIFO at this priority where the OS permits it, else at the lowest nice value it permits "
             "(0 = the default priority); /diagnostics reports what was possible.", True, int_range=(0, 99)),
    ParamDef("control_trigger", "timer", "timer: step at control_rate_hz on the latest inputs; "
             "inputs: step once per new set of inputs (lock-step with a simulator).", True,
             choices=("timer", "inputs")),
    ParamDef("output_type", "float32_array", "Command message type.", True, choices=OUTPUT_TYPES),
    ParamDef("output_topic", "~/action", "Command topic (ros2_control: /<controller>/commands or "
             "/<controller>/joint_trajectory).", True),
    ParamDef("output_joint_names", [], "Commanded joints (names for JointState / "
             "JointTrajectory; for arrays, checks the action size).", True, array_of=str),
    ParamDef("run_mode", "continuous", "continuous: the policy steps whenever active and not "
             "paused; goal: only while a RunPolicy goal runs.", True, choices=("continuous", "goal")),
    ParamDef("rollback_on_cancel", False, "A cancelled Generate or RunPolicy goal restores the "
             "capsule taken when the goal was accepted. Settable live: read when a goal starts "
             "(RunPolicy goals can also ask for it themselves)."),
    ParamDef("inputs_after_restore", "keep", "keep: after a restore, reset, rollback or session switch the "
             "policy steps on the inputs it already holds (the world went on); discard: only on inputs that "
             "arrive after it (a lock-step world restored too publishes its restored observation).", True,
             choices=("keep", "discard")),
    ParamDef("goal_stale_timeout_s", 10.0, "A RunPolicy goal that could not step for this long "
             "(inputs missing, stale, out of sync or in error) ends with STALE_INPUTS (INPUT_REJECTED when "
             "their messages were refused), naming what it waited for (0 = wait for ever). Settable live: "
             "read when a goal starts; a goal's own stale_timeout_s overrides it (0 there: this value; < 0: "
             "wait for ever).", float_range=(0.0, 86400.0)),
)

#: Typed values of ``ROBOT_IO_PARAMS`` (arrays as tuples); every default is the table's.
RobotIOConfig = config_class("RobotIOConfig", ROBOT_IO_PARAMS,
                             "Typed values of the robot I/O parameters (``ROBOT_IO_PARAMS``).", defaults=True)

