"""Test-session set-up shared by every test module.

Every test run gets its own ROS_DOMAIN_ID and localhost-only discovery, so a
developer's running node (or a parallel CI job) can never answer our clients.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("ROS_DOMAIN_ID", str(10 + os.getpid() % 90))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("RCUTILS_LOGGING_BUFFERED_STREAM", "0")
# mujoco picks its GL backend when it is first imported, and any test module may import it first
# (pytest.importorskip at collection): without this, a run that collects test_arm_trained.py before
# test_sim_arm.py got GLFW (no display) and the headless render failed or hung in libmujoco.
os.environ.setdefault("MUJOCO_GL", "egl")


def _interpret_triton_without_gpu() -> None:
    """No GPU: run the triton kernels in triton's interpreter (must be set before triton is imported)."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


_interpret_triton_without_gpu()

# The test-only LeRobot reference (with torchvision) is visible from the start, so transformers
# sees one environment whichever test imports it first (test/lerobot_reference.py says why).
# After the line above: importing torchvision imports triton, which reads TRITON_INTERPRET once.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lerobot_reference import use_reference_packages  # noqa: E402

use_reference_packages()


def pytest_sessionfinish(session, exitstatus) -> None:
    """A file skipped as a whole (no GPU, no launch_testing) is a skip, not "no tests".

    colcon test runs each test file alone (CMakeLists.txt: one ctest test per file) and
    ament counts pytest's exit status 5 (nothing collected) as a failure.
    """
    import pytest

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and reporter is not None \
            and reporter.stats.get("skipped"):
        session.exitstatus = pytest.ExitCode.OK
