"""The README's commands stay true: each one parses, names declared parameters, and the quick starts run as written.

The quick starts run literally (bash, from the checkout, ``HOME`` pointing at a temporary
directory so ``$HOME/my_act_checkpoint`` and the default capsule directory are ours): a tiny
LeRobot ACT with the README's joints and cameras is saved there, this test publishes the
README's topics, and the client block must exit 0 with the results it promises.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from rosproc import REPO, ros_env, stop, wait_for_text

README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands: continuations joined, comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(" ".join(shlex.quote(w) for w in words))
    return out


def block_with(text: str) -> str:
    found = [b for b in BLOCKS if text in b]
    assert len(found) == 1, f"expected one README bash block with {text!r}, found {len(found)}"
    return found[0]


def test_the_two_commands_are_kept_and_ci_runs_the_test_one():
    two = block_with("scripts/demo.sh")
    assert [c.split()[0] for c in commands(two)] == ["scripts/demo.sh", "scripts/test.sh"]
    for script in ("scripts/demo.sh", "scripts/test.sh"):
        assert os.access(REPO / script, os.X_OK), script
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def _flashrt_argv(command: str) -> list[str] | None:
    words = shlex.split(command)
    if words[0] in (".venv/bin/flashrt", "flashrt"):
        words = words[1:]
        if command.startswith("flashrt "):               # the README's shell function adds --node
            words = ["--node", "/robot1/flashrt", *words]
        return [os.path.expandvars(w) for w in words]
    return None


def test_every_flashrt_command_parses_and_names_declared_parameters():
    from rclpy.parameter import get_parameter_value, parameter_value_to_python

    from flashrt_ros.cli import _parser
    from flashrt_ros.interface.node_params import PARAMS
    from flashrt_ros.interface.parameters import check_value
    from flashrt_ros.interface.robot_io_params import ROBOT_IO_PARAMS
    declared = {p.name: p for p in (*PARAMS, *ROBOT_IO_PARAMS)}
    checked = 0
    for block in BLOCKS:
        for command in commands(block):
            argv = _flashrt_argv(command)
            if argv is None:
                continue
            args = _parser().parse_args(argv)            # SystemExit (a failure) on bad usage
            checked += 1
            for item in getattr(args, "param", []):
                name, _, value = item.partition(":=")
                assert name in declared, f"README sets undeclared parameter {name!r}"
                python_value = parameter_value_to_python(get_parameter_value(value))
                assert check_value(declared[name], python_value) is None, item
    assert checked >= 10


def test_the_readmes_flashrt_function_works_from_any_folder(tmp_path):
    """Defined in the checkout as the README says, then called from elsewhere (a user's second terminal
    moves on): it must still find the command (the relative .venv/bin/flashrt did not)."""
    define = next(line for line in block_with("flashrt run-policy --max-steps 150").splitlines()
                  if "flashrt()" in line)
    fake = tmp_path / "checkout"
    (fake / ".venv" / "bin").mkdir(parents=True)
    (fake / ".venv" / "bin" / "flashrt").write_text('#!/bin/sh\necho "flashrt called with: $*"\n')
    (fake / ".venv" / "bin" / "flashrt").chmod(0o755)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", f"{define}\ncd /\nflashrt status"], cwd=fake,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "flashrt called with: --node /robot1/flashrt status" in r.stdout, r.stderr


needs_bare_setup = pytest.mark.skipif(
    not (REPO / ".venv" / "bin" / "flashrt").exists(),
    reason="the README's quick starts call .venv/bin/flashrt, which scripts/setup.sh creates "
           "(a colcon install on a distro has none)")


def quick_start(serve_text: str, client_text: str, home: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run the README block with ``serve_text`` in the background until the node is active, then
    the block with ``client_text`` (bash -e, from the checkout, ``HOME=home``); the node must then
    stop cleanly (status 0, no traceback)."""
    env = ros_env(HOME=str(home))
    log = home / "serve.log"
    node = subprocess.Popen(["bash", "-c", block_with(serve_text)], cwd=REPO, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert wait_for_text(log, "active: serving capsule services", 300, node), log.read_text()
        return subprocess.run(["bash", "-euo", "pipefail", "-c", block_with(client_text)], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        assert stop(node, timeout=30) == 0, log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()


@needs_bare_setup
def test_robot_quick_start_runs_as_written(tmp_path):
    """Without LeRobot: the README's own make-checkpoint line writes the camera checkpoint (before the fake
    sensors start, which read it), the serve block then finds it."""
    serve = block_with("flashrt serve --namespace /robot1")     # names taken from the README
    joints = re.search(r"input_joint_names:=\[(.*?)\]", serve).group(1).split(", ")
    cameras = re.search(r"input_image_features:=\[(.*?)\]", serve).group(1).split(", ")
    make = next(line for line in serve.splitlines() if "flashrt make-checkpoint" in line)
    assert f"--joints {len(joints)}" in make and f"--cameras {','.join(c.split('.')[-1] for c in cameras)}" in make
    export = re.search(r"export CKPT=\S+", serve).group(0)
    made = subprocess.run(["bash", "-euc", f"{export}; {make}"], cwd=REPO,
                          env=ros_env(HOME=str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0 and "wrote an ACT checkpoint" in made.stdout, made.stdout + made.stderr
    # no robot: the README's own fake-sensors block publishes what the checkpoint expects
    fake_log = tmp_path / "fake.log"
    fake = subprocess.Popen(["bash", "-c", block_with("fake-sensors --checkpoint")], cwd=REPO,
                            env=ros_env(HOME=str(tmp_path)), stdout=open(fake_log, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        assert wait_for_text(fake_log, "fake sensors for", 300, fake), fake_log.read_text()
        r = quick_start("flashrt serve --namespace /robot1", "run-policy --max-steps 150", tmp_path, 400)
    finally:
        stop(fake)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "lifecycle_state" in r.stdout and "active" in r.stdout
    assert "150 steps, stop: max_steps" in r.stdout and "30 steps, stop: max_steps" in r.stdout
    assert "snapshot before_grasp" in r.stdout and "restored before_grasp" in r.stdout
    assert "] robot1/flashrt: engine: active" in r.stdout, r.stdout       # flashrt diagnostics (OK, or WARN on a late frame)
    assert "/camera/wrist/image_raw/compressed" in fake_log.read_text() and "Traceback" not in fake_log.read_text()


@needs_bare_setup
def test_llm_quick_start_runs_as_written(tmp_path):
    r = quick_start(".venv/bin/flashrt serve    #", 'generate "Name three colours."', tmp_path, 600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "snapshot home" in r.stdout and "restored home" in r.stdout
    assert r.stderr.count("tokens, stop:") == 2, r.stderr


def test_every_relative_link_of_the_readme_exists():
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]*))?\)", README)
    assert links
    for target, anchor in links:
        if target.startswith("http"):
            continue
        path = REPO / target
        assert path.exists(), target
        if anchor:
            headings = re.findall(r"^#+ (.*)$", path.read_text(), flags=re.M)
            slugs = {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, f"{target}#{anchor}"
