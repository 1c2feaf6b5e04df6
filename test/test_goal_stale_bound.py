"""What ``goal_stale_timeout_s`` and a goal's ``stale_timeout_s`` mean, as the code does it and as the docs
say it (issue #50: docs/robot_io.md's table said 0 waits for ever, its text said < 0)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from flashrt_ros.ros.policy_action import GoalRun, PolicyActionServer
from rosproc import REPO


def bound(node_value: float, goal_value: float) -> float:
    """The bound a goal runs under: ``PolicyActionServer._stale_timeout`` with the node's parameter (the
    other robot I/O parameters at their defaults)."""
    from flashrt_ros.interface.robot_io_params import ROBOT_IO_PARAMS
    values = {p.name: p.default for p in ROBOT_IO_PARAMS} | {"goal_stale_timeout_s": node_value}
    node = SimpleNamespace(get_parameter=lambda name: SimpleNamespace(value=values[name]))
    server = SimpleNamespace(_node=node)
    return PolicyActionServer._stale_timeout(server, SimpleNamespace(stale_timeout_s=goal_value))


def gives_up(stale_timeout_s: float) -> bool:
    """Whether a goal that has waited for an hour ends with STALE_INPUTS under ``stale_timeout_s``."""
    run = GoalRun(max_steps=10, max_duration_s=0.0, stale_timeout_s=stale_timeout_s)
    run.waiting("stale: /joint_states")
    return run.waited_too_long(time.monotonic() + 3600.0)


@pytest.mark.parametrize("node_value, goal_value, gives_up_after_an_hour", [
    (10.0, 0.0, True),          # the goal keeps the node's bound
    (0.0, 0.0, False),          # the node's 0: wait for ever
    (0.0, 5.0, True),           # the goal's own bound wins
    (10.0, -1.0, False),        # the goal's < 0: wait for ever
])
def test_the_bound_a_goal_runs_under(node_value, goal_value, gives_up_after_an_hour):
    assert gives_up(bound(node_value, goal_value)) == gives_up_after_an_hour


def test_the_docs_say_what_the_code_does():
    text = " ".join((REPO / "docs" / "robot_io.md").read_text().split())
    row = text.split("| `goal_stale_timeout_s` |")[1].split("Range")[0]          # the table's row
    assert "(0 = wait for ever)" in row and "(0 there: this value; < 0: wait for ever)" in row
    assert "After `goal_stale_timeout_s` (10 s by default; 0 waits for ever)" in text
    assert "0 there keeps the node's value, < 0 waits for ever" in text
