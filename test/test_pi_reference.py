"""The π0 / π0.5 test reference: transformers 4.53.2 plus our shim of openpi's changes runs LeRobot's π policies.

The checks run in the reference's own process (``pi_reference/selfcheck.py``
says what each proves); this test fails with that process's output when one
does. Parity of our model with this reference: ``test_lerobot_pi0.py``.
"""
from __future__ import annotations

from pi_reference import run_selfcheck


def test_the_shim_reproduces_openpis_changes_and_lerobots_pi_policies_run():
    report = run_selfcheck()
    print("\n".join(report))
    assert len(report) == 6 and all(line.endswith(": ok") for line in report), report
