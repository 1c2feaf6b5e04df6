"""The exit status of every ``flashrt`` command, and the error names it prints."""
from __future__ import annotations

from flashrt_ros.interface.errors import code_name  # noqa: F401 - the names the commands print

#: Exit status of every command (also printed by --help).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 3, 130, 143
EXIT_CODES = f"""exit status:
  {EXIT_OK}    success
  {EXIT_FAILED}    the node answered success=false (or rejected the goal)
  {EXIT_USAGE}    bad usage
  {EXIT_UNREACHABLE}    the node could not be reached within --timeout
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); a running generation, run-policy goal or tree is
       cancelled at its next committed boundary first
  {EXIT_TERMINATED}  terminated (SIGTERM): the same orderly stop as Ctrl-C"""


def interrupted_exit(interrupt: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM (``client.Terminated``)."""
    from flashrt_ros.client import Terminated
    return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
