"""A MuJoCo two-joint planar arm that reaches for a target, seen by an overhead camera.

Why our own small model: the interrupt-and-resume demo needs a physics world
that is exactly replayable (same seed, same commands -> same bits) and whose
complete state can be taken and put back. MuJoCo gives both: the integration
state (``mjSTATE_INTEGRATION``: time, qpos, qvel, act, warm-start, controls, ...)
is everything the next step depends on, read with ``mj_getState`` and written
with ``mj_setState``. Rendering is headless (``MUJOCO_GL=egl`` or ``osmesa``).

Commands are joint position targets (radians) for the two position actuators,
as a ros2_control forward position controller would send them.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

JOINTS = ("shoulder", "elbow")

MJCF = """
<mujoco model="flashrt_reacher">
  <compiler angle="radian"/>  <!-- MJCF's default unit is degrees: the elbow's range would be +-2.6 deg -->
  <option timestep="{timestep}" integrator="implicitfast"/>
  <visual>
    <global offwidth="{width}" offheight="{height}"/>
    <quality shadowsize="0" offsamples="0"/>  <!-- no shadow map, no multisampling: cheap on a software GL -->
  </visual>
  <worldbody>
    <light pos="0 0 2" dir="0 0 -1" castshadow="false"/>
    <geom type="plane" size="0.5 0.5 0.01" rgba="0.85 0.85 0.85 1"/>
    <camera name="overhead" pos="0 0 0.45" xyaxes="1 0 0 0 1 0" fovy="60"/>
    <body name="upper" pos="0 0 0.02">
      <joint name="shoulder" type="hinge" axis="0 0 1" damping="0.05"/>
      <geom type="capsule" fromto="0 0 0 0.12 0 0" size="0.012" rgba="0.2 0.4 0.8 1" mass="0.1"/>
      <body name="fore" pos="0.12 0 0">
        <joint name="elbow" type="hinge" axis="0 0 1" range="-2.6 2.6" damping="0.05"/>
        <geom type="capsule" fromto="0 0 0 0.12 0 0" size="0.010" rgba="0.8 0.4 0.2 1" mass="0.08"/>
        <site name="tip" pos="0.12 0 0" size="0.015" rgba="0.1 0.1 0.1 1"/>
      </body>
    </body>
    <body name="target" mocap="true" pos="0.15 0.1 0.02">
      <geom type="sphere" size="0.02" rgba="0.1 0.8 0.2 1" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
  <actuator>
    <position name="shoulder" joint="shoulder" kp="2.0" kv="0.1" ctrlrange="-3.1 3.1"/>
    <position name="elbow" joint="elbow" kp="1.5" kv="0.08" ctrlrange="-2.6 2.6"/>
  </actuator>
</mujoco>
"""


@dataclass(frozen=True)
class ArmConfig:
    control_period_s: float = 0.02     # one step() per control period (50 Hz)
    timestep_s: float = 0.002          # physics step: 10 per control period
    image_width: int = 64
    image_height: int = 64
    render: bool = True


class ArmSim:
    """``reset(seed)``, ``step(command)``, ``render()``, ``get_state()``/``set_state()``."""

    def __init__(self, cfg: ArmConfig = ArmConfig(), seed: int = 0) -> None:
        os.environ.setdefault("MUJOCO_GL", "egl")      # headless by default (Mesa EGL; or osmesa)
        import mujoco
        self._mj = mujoco
        self.cfg = cfg
        self.model = mujoco.MjModel.from_xml_string(MJCF.format(
            timestep=cfg.timestep_s, width=cfg.image_width, height=cfg.image_height))
        self.data = mujoco.MjData(self.model)
        self.substeps = max(1, round(cfg.control_period_s / cfg.timestep_s))
        self._spec = mujoco.mjtState.mjSTATE_INTEGRATION
        # A GL context is current on one thread only: one worker thread owns the renderer,
        # so render() may be called from any thread (ROS executor callbacks).
        self._gl_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arm_gl") if cfg.render else None
        self._renderer = (self._gl_thread.submit(
            mujoco.Renderer, self.model, cfg.image_height, cfg.image_width).result()
            if cfg.render else None)
        self.steps = 0
        self.reset(seed)

    def reset(self, seed: int) -> None:
        """A new episode: joint angles and the target drawn from ``seed`` only."""
        rng = np.random.default_rng(seed)
        self._mj.mj_resetData(self.model, self.data)
        self.data.qpos[:] = rng.uniform(-1.0, 1.0, 2)
        self.data.ctrl[:] = self.data.qpos
        radius, angle = rng.uniform(0.08, 0.22), rng.uniform(-np.pi, np.pi)
        self.data.mocap_pos[0] = [radius * np.cos(angle), radius * np.sin(angle), 0.02]
        self._mj.mj_forward(self.model, self.data)
        self.steps = 0

    def step(self, command: np.ndarray | list[float]) -> None:
        """Hold the position targets for one control period."""
        cmd = np.asarray(command, dtype=np.float64).reshape(-1)
        if cmd.shape != (2,) or not np.all(np.isfinite(cmd)):
            raise ValueError(f"command must be 2 finite joint targets, got {cmd.tolist()}")
        lo, hi = self.model.actuator_ctrlrange[:, 0], self.model.actuator_ctrlrange[:, 1]
        self.data.ctrl[:] = np.clip(cmd, lo, hi)
        self._mj.mj_step(self.model, self.data, nstep=self.substeps)
        self.steps += 1

    def joint_positions(self) -> np.ndarray:
        return self.data.qpos[:2].copy()

    def joint_velocities(self) -> np.ndarray:
        return self.data.qvel[:2].copy()

    def target_xy(self) -> np.ndarray:
        """The target's (x, y) in metres (the task's goal; published by the sim node as ``~/target``)."""
        return self.data.mocap_pos[0][:2].copy()

    def set_target(self, xy: np.ndarray | list[float]) -> None:
        """Move the target to ``xy`` (metres; the arm reaches radius 0.24)."""
        target = np.asarray(xy, dtype=np.float64).reshape(-1)
        if target.shape != (2,) or not np.all(np.isfinite(target)):
            raise ValueError(f"target must be 2 finite coordinates (x, y) in metres, got {target.tolist()}")
        self.data.mocap_pos[0][:2] = target
        self._mj.mj_forward(self.model, self.data)

    def tip_xy(self) -> np.ndarray:
        return self.data.site("tip").xpos[:2].copy()

    def distance_to_target(self) -> float:
        return float(np.linalg.norm(self.tip_xy() - self.target_xy()))

    def render(self) -> np.ndarray:
        """The overhead camera as ``(height, width, 3)`` uint8 RGB."""
        if self._renderer is None:
            raise RuntimeError("rendering is off (ArmConfig.render=False)")
        def draw() -> np.ndarray:
            self._renderer.update_scene(self.data, camera="overhead")
            return self._renderer.render().copy()
        return self._gl_thread.submit(draw).result()

    # --- exact state -----------------------------------------------------------
    def get_state(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(integration state, target position, steps): everything the next step depends on."""
        state = np.empty(self._mj.mj_stateSize(self.model, self._spec))
        self._mj.mj_getState(self.model, self.data, state, self._spec)
        return state, self.data.mocap_pos.copy(), self.steps

    def set_state(self, snapshot: tuple[np.ndarray, np.ndarray, int]) -> None:
        state, mocap, steps = snapshot
        self._mj.mj_setState(self.model, self.data, state, self._spec)
        self.data.mocap_pos[:] = mocap
        self._mj.mj_forward(self.model, self.data)
        self.steps = steps

    def close(self) -> None:
        if self._renderer is not None:
            self._gl_thread.submit(self._renderer.close).result()
            self._gl_thread.shutdown()
            self._renderer = None
