"""How node and clients name a goal: its UUID as 32 lowercase hex digits.

Why declared here: the id travels as text between the two sides: a client renews its goals by
these ids (``GoalHeartbeat.goal_ids``), ``~/status`` shows the running goal's (``goal_id``), a
refused goal's message names it and ``flashrt cancel`` takes it back.
"""
from __future__ import annotations

from typing import Any

#: How long the node's action servers keep a finished goal (its id and result; rclpy's ``result_timeout``,
#: 10 s by default): a copy of a goal request under that id is refused as tracked, so it never runs twice,
#: and a lost result can still be asked for.
GOAL_RETENTION_S = 600
#: How long after the first send a client may send copies of a goal request: well inside the retention.
GOAL_RESEND_HORIZON_S = 120.0


def goal_id_hex(goal_id: Any) -> str:
    """A goal id (``unique_identifier_msgs/UUID``, or its ``uuid`` bytes) as 32 hex digits."""
    raw = getattr(goal_id, "uuid", goal_id)
    return bytes(bytearray(raw)).hex()
