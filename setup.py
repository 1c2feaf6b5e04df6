"""Python packaging of the flashrt_ros library for the bare-machine route.

On a ROS 2 distro the package is built by colcon through CMakeLists.txt (which
also generates the interfaces); this file is used by ``scripts/setup.sh`` for an
editable install into ``.venv`` (console scripts, dependency metadata).
"""
from pathlib import Path

from setuptools import find_packages, setup

requirements = [
    line.strip()
    for line in Path(__file__).with_name("requirements.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]

setup(
    name="flashrt_ros",
    version="0.1.0",
    description="Execution-state capsules for graph-captured LLM and policy engines in ROS 2",
    license="Apache-2.0",
    packages=find_packages(include=["flashrt_ros", "flashrt_ros.*"]),
    python_requires=">=3.10",
    install_requires=requirements,
    entry_points={
        "console_scripts": [
            "flashrt = flashrt_ros.cli:main",
            "flashrt_node = flashrt_ros.ros.node:main",
            "flashrt-bench = flashrt_ros.benchmarks.llm:main",
        ],
    },
)
