"""The MuJoCo interrupt-and-resume demo, short: resumed actions bit-identical, a reset differs."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

os.environ.setdefault("MUJOCO_GL", "egl")   # read when mujoco is imported
pytest.importorskip("mujoco", reason="mujoco is not installed (scripts/setup_sim.sh installs it)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (scripts/setup_sim.sh installs it)")

from rosproc import REPO  # noqa: E402


def test_short_demo_resumes_bit_identically_and_writes_the_png(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("arm_demo", REPO / "examples" / "mujoco_interrupt_resume.py")
    demo = importlib.util.module_from_spec(spec)
    sys.modules["arm_demo"] = demo                      # dataclasses look their module up
    spec.loader.exec_module(demo)
    code = demo.main(["--steps", "30", "--interrupts", "10,20", "--retract-steps", "4",
                      "--image", "32", "--out", str(tmp_path)])
    import gc
    gc.collect()                       # an rclpy Task with an unretrieved exception reports it when collected
    captured = capsys.readouterr()
    out = captured.out
    assert "never retrieved" not in captured.err, captured.err
    assert "BIT-IDENTICAL" in out and "differs after the interrupt" in out, out
    assert code == 0
    assert out.count("interrupt at policy step") == 2 and out.count("resumed at policy step") == 2
    assert "retract arm (operator) [✓] -- 4/4" in out and "restore policy [✓]" in out
    png = tmp_path / "arm_demo.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
