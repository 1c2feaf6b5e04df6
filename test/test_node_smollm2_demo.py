"""End to end on the real model: the README's demo (SmolLM2-135M-Instruct, CPU) through ROS."""
from __future__ import annotations

import subprocess
import sys

from rosproc import ros_env


def test_demo_on_smollm2_is_token_identical_after_restore(tmp_path):
    run = subprocess.run([sys.executable, "-m", "flashrt_ros.cli", "demo", "--tokens", "16"],
                         capture_output=True, text=True, env=ros_env(TMPDIR=str(tmp_path)), timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert not list(tmp_path.glob("flashrt_demo_*")), "the demo left its temporary folder behind"
    assert "follow-up after restore token-identical | yes" in out
    assert "live state == capsule after restore | yes" in out
    assert "1. Red" in out          # the real model answers the colour question sensibly
