"""The live-topic rate benchmark runs end to end (tiny ACT, a few seconds): it is a measurement, so
only its plumbing is checked here, never a rate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.parametrize("driver", ["process", "thread"])
def test_robot_rate_benchmark_measures_commands_from_a_built_act(tmp_path: Path, capsys, driver: str) -> None:
    from lerobot_reference import lerobot
    lerobot()                                     # skips without the LeRobot reference
    from benchmarks.robot_rate import main
    out = tmp_path / "rate.json"
    assert main(["--smoke", "--policy-hw", "24", "32", "--camera-size", "64", "48", "--seconds", "3",
                 "--warmup", "1", "--driver", driver, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["commands_in_window"] > 0 and result["achieved_hz"] > 0
    assert result["driver"] == driver and result["sensor_gap_ms"][0] > 0     # the driver's publishes were counted
    assert result["joints"] == 14 and result["cameras"].startswith("2 x 64x48")
    assert result["provenance"]["git"]["commit"] and result["provenance"]["cpu"]
    table = capsys.readouterr().out
    assert "requested / achieved rate" in table and "stale flips" in table and "load average" in table
