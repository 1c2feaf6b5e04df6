"""Replanning seen from the CLI and the log (issue #50, item 4), without a node: the serve log's
lines (``ros.replan_log``), ``flashrt status``'s replan fields, ``flashrt diagnostics``'s format.
Through a real node: ``test_async_replan_node.py``."""
from __future__ import annotations

from types import SimpleNamespace

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus

from flashrt_ros.cli.diagnostics_command import format_entry, node_entries
from flashrt_ros.cli.query_commands import format_status
from flashrt_ros.ros import conversions as conv
from flashrt_ros.ros.diagnostics import diagnostics_message
from flashrt_ros.ros.replan_log import ReplanLog, describe


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self.info = lambda msg: self.lines.append(("info", msg))
        self.warning = lambda msg: self.lines.append(("warning", msg))


def replan(**counts):
    base = {"mode": "async", "delay_steps": 3, "chunk_steps": 47, "turnaround_p95_ms": 120.25,
            "launched": 0, "merged": 0, "late": 0, "held": 0, "dropped": 0}
    return {**base, **counts}


def test_the_log_says_the_mode_on_activate_then_reports_plans_at_most_every_period():
    now = SimpleNamespace(t=0.0)
    log = Lines()
    r = ReplanLog(log, period_s=10.0, clock=lambda: now.t)
    r.started(replan())
    assert log.lines == [("info", "replan async: delay 3 steps (plan p95 120.2 ms), a merged chunk lasts 47 steps")]
    now.t = 5.0
    r.update(replan(launched=4, merged=4))
    assert len(log.lines) == 1, "within the period: no line"
    now.t = 10.0
    r.update(replan(launched=6, merged=6))
    assert log.lines[-1] == ("info", "replan async: delay 3 steps (plan p95 120.2 ms), a merged chunk lasts 47 "
                                     "steps; since the last report: 6 launched, 6 merged, 0 late, 0 held steps, "
                                     "0 dropped")
    now.t = 30.0
    r.update(replan(launched=6, merged=6))
    assert len(log.lines) == 2, "no plan since: no line"
    r.update(replan(launched=8, merged=7, late=1, held=2))
    level, text = log.lines[-1]
    assert level == "warning" and "2 launched, 1 merged, 1 late, 2 held steps, 0 dropped" in text
    assert "lower the control rate, or plan faster" in text


def test_a_synchronous_node_says_its_mode_once_and_nothing_after():
    log = Lines()
    r = ReplanLog(log, period_s=0.0)
    r.started({"mode": "sync"})
    r.update({"mode": "sync"})
    assert log.lines == [("info", "replan sync")]
    assert describe({"mode": "rtc", "delay_steps": 2, "chunk_steps": 8, "turnaround_p95_ms": float("nan")}) == \
        "rtc: delay 2 steps, a merged chunk lasts 8 steps"


def test_status_carries_the_replan_fields_and_the_cli_prints_them_for_plans_beside_the_loop():
    status = {"engine_kind": "policy", "model": "lerobot:x", "replan": replan(launched=9, merged=8, late=1, held=3)}
    msg = conv.engine_status(status, "active", Time())
    assert (msg.replan_mode, msg.replan_delay_steps, msg.replan_chunk_steps) == ("async", 3, 47)
    assert (msg.replan_launched, msg.replan_merged, msg.replan_late, msg.replan_held) == (9, 8, 1, 3)
    shown = dict(line.split(None, 1) for line in format_status(msg).splitlines() if len(line.split(None, 1)) == 2)
    assert shown["replan_mode"] == "async" and shown["replan_late"] == "1" and shown["replan_held"] == "3"
    assert shown["replan_turnaround_p95_ms"] == "120.25"
    sync = conv.engine_status({"engine_kind": "policy", "replan": {"mode": "sync"}}, "active", Time())
    text = format_status(sync)
    assert "replan_mode" in text and "replan_late" not in text, "sync: nothing is planned beside the loop"


def test_diagnostics_prints_the_nodes_entry_with_its_level_and_values():
    status = {"engine_kind": "policy", "device": "cpu", "inputs_state": "stale",
              "inputs_detail": "stale: /js (oldest 2.000 s > max_observation_age_s 0.100 s)",
              "replan": replan(delay_steps=60, chunk_steps=10)}
    array = diagnostics_message("/robot1/flashrt", status, "active", Time())
    other = DiagnosticStatus(name="robot2/flashrt: engine", message="active")
    array.status.append(other)
    mine = node_entries(array, "/robot1/flashrt", everyone=False)
    assert [e.name for e in mine] == ["robot1/flashrt: engine"]
    assert len(node_entries(array, "/robot1/flashrt", everyone=True)) == 2
    text = format_entry(mine[0])
    assert text.splitlines()[0] == ("[WARN] robot1/flashrt: engine: active, policy stopped: inputs stale: /js "
                                    "(oldest 2.000 s > max_observation_age_s 0.100 s)")
    assert "  hardware_id  cpu" in text and "replan_delay_steps" in text and "replan_late" in text
