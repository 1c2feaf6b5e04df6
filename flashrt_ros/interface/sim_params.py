"""The simulator node's parameters (``python -m flashrt_ros.sim.node``, the MuJoCo arm):
``SIM_PARAMS`` and its typed config ``SimConfig``. See ``parameters``."""
from __future__ import annotations

from dataclasses import replace

from flashrt_ros.interface.node_params import CONTROL_RATE_HZ
from flashrt_ros.interface.parameters import ParamDef, config_class

SIM_PARAMS: tuple[ParamDef, ...] = (
    ParamDef("seed", 0, "Seed of an episode: the start pose and the target. Settable live: read by "
             "~/reset, which starts a new episode from it."),
    ParamDef("target", [], "The target [x, y] in metres. Settable live (ros2 param set /sim target "
             "\"[0.1, 0.15]\", a tree's SetParameter): moves the target at once, without publishing, so the "
             "next command's observation shows it; 2 finite numbers (a reset draws a new one from seed).",
             array_of=float),
    ParamDef("publish_on_restore", False, "~/restore publishes the restored observation (a tree that "
             "restores the world and the policy then resumes on exactly the observation the snapshot saw). "
             "Settable live."),
    ParamDef("mode", "lockstep", "lockstep: every command advances the physics by one control period and "
             "the new observation is published at once (exactly replayable whatever the load); realtime: "
             "a timer at control_rate_hz steps with the latest command and publishes.", True,
             choices=("lockstep", "realtime")),
    replace(CONTROL_RATE_HZ, description="Control rate: one command advances the physics by one "
            "period (and, mode realtime, the timer steps at it)."),
    ParamDef("render", True, "Render and publish the overhead camera on ~/image.", True),
    ParamDef("image_width", 64, "Camera image width (pixels).", True, int_range=(1, 4096)),
    ParamDef("image_height", 64, "Camera image height (pixels).", True, int_range=(1, 4096)),
)

#: Typed values of ``SIM_PARAMS`` (``target`` as a tuple).
SimConfig = config_class("SimConfig", SIM_PARAMS, "Typed values of the simulator's parameters (``SIM_PARAMS``).")
