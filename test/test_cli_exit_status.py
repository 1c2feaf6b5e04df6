"""Every way a goal can end has its own exit status (issue #50): completed 0, failed 1, cancelled by
another client 4, interrupted 130 / 143; and the last line says which. ``run-policy`` and ``generate``
against a client whose answers are given (no ROS): each outcome the node can report."""
from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from flashrt_ros.action import Generate, RunPolicy
from flashrt_ros.cli import (EXIT_CANCELLED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, _parser)
from flashrt_ros.cli.goal_commands import generate_command, run_policy_command
from flashrt_ros.client import Terminated
from flashrt_ros.runtime.errors import ErrorCode


class AnsweringClient:
    """``run_policy`` / ``generate`` return the given result, or raise the given interrupt carrying it."""

    def __init__(self, result, interrupt: BaseException | None = None) -> None:
        self.result, self.interrupt = result, interrupt

    def _answer(self):
        if self.interrupt is not None:
            self.interrupt.result = self.result
            raise self.interrupt
        return SimpleNamespace(result=self.result, accepted=True, status=0, feedback_count=0)

    def run_policy(self, **_):
        return self._answer()

    def generate(self, *_, **__):
        return self._answer()


def policy_result(stop_reason: str, success: bool = True, error: ErrorCode = ErrorCode.OK, **fields):
    return RunPolicy.Result(success=success, error_code=int(error), stop_reason=stop_reason, steps=7,
                            message=fields.pop("message", f"7 steps, stop: {stop_reason}"), **fields)


def run_policy_args() -> argparse.Namespace:
    return _parser().parse_args(["run-policy", "--max-steps", "100", "--quiet"])


@pytest.mark.parametrize("result, interrupt, code, says", [
    (policy_result("max_steps"), None, EXIT_OK, "7 steps, stop: max_steps"),
    (policy_result("max_duration"), None, EXIT_OK, "7 steps, stop: max_duration"),
    (policy_result("cancelled"), None, EXIT_CANCELLED,
     "goal cancelled by another client (flashrt cancel, or another program) after 7 steps"),
    (policy_result("cancelled", rolled_back=True), None, EXIT_CANCELLED,
     "after 7 steps, rolled back to the goal's start"),
    (policy_result("deactivated"), None, EXIT_FAILED, "the goal ended after 7 steps: the node was deactivated"),
    (policy_result("stale_inputs", False, ErrorCode.STALE_INPUTS, message="no policy step for 10.0 s"), None,
     EXIT_FAILED, "error (STALE_INPUTS): no policy step for 10.0 s"),
    (policy_result("lease_expired", False, ErrorCode.LEASE_EXPIRED, message="lease"), None, EXIT_FAILED,
     "error (LEASE_EXPIRED)"),
    (policy_result("shutdown", False, ErrorCode.CANCELLED, message="the node is shutting down"), None,
     EXIT_FAILED, "error (CANCELLED): the node is shutting down"),
    (policy_result("cancelled"), KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted: goal cancelled after 7 steps"),
    (policy_result("cancelled"), Terminated(), EXIT_TERMINATED, "interrupted: goal cancelled after 7 steps"),
])
def test_run_policy_exit_status_names_how_the_goal_ended(capsys, result, interrupt, code, says):
    assert run_policy_command(run_policy_args(), AnsweringClient(result, interrupt)) == code
    out = capsys.readouterr()
    assert says in out.out + out.err, out


def generate_result(stop_reason: str, success: bool = True, error: ErrorCode = ErrorCode.OK):
    return Generate.Result(success=success, error_code=int(error), stop_reason=stop_reason, text="hi",
                           token_ids=[1, 2], position=9, message=f"2 tokens, stop: {stop_reason}")


@pytest.mark.parametrize("result, interrupt, code, says", [
    (generate_result("max_new_tokens"), None, EXIT_OK, "2 tokens, stop: max_new_tokens"),
    (generate_result("cancelled"), None, EXIT_CANCELLED,
     "generation cancelled by another client (flashrt cancel, or another program) at position 9"),
    (generate_result("cancelled", False, ErrorCode.CANCELLED), None, EXIT_FAILED, "error (CANCELLED)"),
    (generate_result("cancelled"), KeyboardInterrupt(), EXIT_INTERRUPTED,
     "interrupted: generation cancelled at position 9"),
])
def test_generate_exit_status_names_how_the_goal_ended(capsys, result, interrupt, code, says):
    args = _parser().parse_args(["generate", "hi"])
    assert generate_command(args, AnsweringClient(result, interrupt)) == code
    out = capsys.readouterr()
    assert says in out.out + out.err, out


def test_help_documents_every_exit_status():
    text = _parser().format_help()
    for code, meaning in ((EXIT_OK, "completed"), (EXIT_FAILED, "success=false"),
                          (EXIT_CANCELLED, "cancelled by another client"), (EXIT_INTERRUPTED, "Ctrl-C"),
                          (EXIT_TERMINATED, "SIGTERM")):
        assert any(line.split()[:1] == [str(code)] and meaning in line for line in text.splitlines()), (code, text)
