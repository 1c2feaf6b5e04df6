"""The exit status of every ``flashrt`` command, and the error names it prints."""
from __future__ import annotations

from flashrt_ros.interface.errors import code_name  # noqa: F401 - the names the commands print

#: Exit status of every command (also printed by --help). A goal (run-policy, generate) ends in
#: exactly one of: completed (0), failed (1), cancelled by another client (4), interrupted (130, 143):
#: a script can tell them apart without reading the output.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_CANCELLED = 0, 1, 2, 3, 4
EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_OUTPUT_CLOSED = 130, 143, 141
EXIT_CODES = f"""exit status:
  {EXIT_OK}    success (a goal: completed, e.g. its --max-steps ran)
  {EXIT_FAILED}    the node answered success=false, rejected the goal, or ended it itself
       (an error code is printed: STALE_INPUTS, LEASE_EXPIRED, CANCELLED on a node shutdown or
       deactivation, ...), or it died or restarted while the command waited (NODE_GONE)
  {EXIT_USAGE}    bad usage
  {EXIT_UNREACHABLE}    the node could not be reached within --timeout
  {EXIT_CANCELLED}    the goal was cancelled by another client (flashrt cancel, another program)
       before it completed
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a running generation, run-policy goal or tree is
       cancelled at its next committed boundary first
  {EXIT_TERMINATED}  terminated (SIGTERM): the same orderly stop as Ctrl-C
  {EXIT_OUTPUT_CLOSED}  the reader of the output went away (run-policy | head): the same orderly stop,
       silently"""


def interrupted_exit(interrupt: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (``client.Terminated``)."""
    from flashrt_ros.client import Terminated
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
