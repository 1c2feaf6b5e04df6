"""The bounded torture run (test/torture.py) in its short mode: no crash, hang, loss or INTERNAL answer.

About two to three minutes on a loaded 2-core machine: three fuzzing clients and a saver for
60 s against a node that is killed with SIGKILL twice while saving, then restarted.
"""
from __future__ import annotations

import json
import subprocess
import sys

from rosproc import REPO, ros_env


def test_torture_short_mode_has_no_crash_hang_lost_capsule_or_internal_error(tmp_path):
    out = subprocess.run([sys.executable, "test/torture.py", "--seconds", "60", "--clients", "3",
                          "--kills", "2", "--workdir", str(tmp_path)], cwd=REPO, env=ros_env(),
                         capture_output=True, text=True, timeout=900)
    print(out.stdout[-6000:])
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("TORTURE ")), None)
    assert line is not None, out.stdout[-3000:] + out.stderr[-3000:]
    counts = json.loads(line[len("TORTURE "):])
    assert counts["calls"] > 100 and counts["ok"] > 0 and counts["clear_errors"] > 0
    assert counts["kills"] == 2 and counts["restarts_checked"] == 3
    assert (counts["crashes"], counts["hangs"], counts["lost"], counts["internal"]) == (0, 0, 0, 0), out.stdout
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
