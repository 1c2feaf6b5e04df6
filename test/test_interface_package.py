"""The contract is a leaf (``flashrt_ros/interface/``), and the client, the CLI and the trees stand on
it alone: a behaviour tree on a robot's laptop loads no server code, no runtime and no torch."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flashrt_ros"
#: What ``interface/`` may import besides the standard library: the generated interfaces.
GENERATED = ("flashrt_ros.msg", "flashrt_ros.srv", "flashrt_ros.action", "std_srvs")
#: Library packages a client-side module must not import (the server and everything below it).
SERVER_SIDE = ("ros", "runtime", "engine", "models", "ops", "robot_io", "sim")


def imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every absolute import in ``path``, also those inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
    return found


def test_interface_imports_only_itself_the_generated_interfaces_and_the_standard_library():
    stdlib = set(sys.stdlib_module_names)
    leaks = []
    for path in sorted((PACKAGE / "interface").glob("*.py")):
        for module, line in imports(path):
            top = module.split(".")[0]
            allowed = (top in stdlib or module.startswith("flashrt_ros.interface") or module.startswith(GENERATED)
                       or (path.name in ("qos.py", "topic_types.py") and module == "rclpy.qos"))  # profiles: rclpy's
            if not allowed:
                leaks.append(f"{path.name}:{line} imports {module}")
    assert leaks == []


def test_client_cli_and_trees_import_no_server_side_module():
    # `flashrt serve` runs the node, `fake-sensors` and `watch-commands` run ROS nodes of their own, and
    # `make-checkpoint` writes a policy with the model code: the CLI's only ways into the server side, each
    # imported only by its command.
    allowed = {("cli/__init__.py", "flashrt_ros.ros.node"), ("cli/robot_tools.py", "flashrt_ros.ros.fake_sensors"),
               ("cli/robot_tools.py", "flashrt_ros.ros.command_watch"),
               ("cli/robot_tools.py", "flashrt_ros.models.lerobot")}
    leaks = []
    for folder in ("client", "cli", "bt"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            where = str(path.relative_to(PACKAGE))
            for module, line in imports(path):
                parts = module.split(".")
                if parts[0] == "flashrt_ros" and len(parts) > 1 and parts[1] in SERVER_SIDE \
                        and (where, module) not in allowed:
                    leaks.append(f"{where}:{line} imports {module}")
                if parts[0] == "torch":
                    leaks.append(f"{where}:{line} imports torch")
    assert leaks == []


def test_importing_the_client_cli_and_trees_loads_no_server_code_and_no_torch():
    probe = ("import json, sys\n"
             "import flashrt_ros.client, flashrt_ros.client.goal_admin, flashrt_ros.client.background_executor\n"
             "import flashrt_ros.cli, flashrt_ros.cli.demo\n"
             "import flashrt_ros.bt, flashrt_ros.bt.nodes, flashrt_ros.bt.run, flashrt_ros.bt.tree_xml\n"
             "try:\n    import flashrt_ros.bt.btcpp\nexcept ImportError:\n    pass\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=PACKAGE.parent)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout)
    server = [m for m in loaded if m.split(".")[:2] in (["flashrt_ros", s] for s in SERVER_SIDE)]
    assert server == []
    assert "torch" not in loaded
    assert "flashrt_ros.interface.services" in loaded       # the probe did load the contract


def test_the_runtime_raises_the_declared_codes():
    from flashrt_ros.interface.errors import ErrorCode
    from flashrt_ros.runtime import errors
    assert errors.ErrorCode is ErrorCode
    assert errors.StaleInputs("x").code is ErrorCode.STALE_INPUTS


@pytest.mark.parametrize("name", ["interface/errors.py", "interface/parameters.py"])
def test_the_pure_declarations_need_no_ros(name):
    """The runtime imports ``interface.errors``: it must load without rclpy or any message."""
    assert all(module.split(".")[0] in sys.stdlib_module_names or module.startswith("flashrt_ros.interface")
               for module, _line in imports(PACKAGE / name))
