"""Joint states -> the policy's state vector, in the order a parameter names the joints.

Why by name: drivers publish joints in any order and often more joints than a
policy uses (grippers, wheels). A joint the policy needs but the message lacks
is an error naming the joint, never a silent zero.
"""
from __future__ import annotations

from typing import Sequence

import torch

from flashrt_ros.runtime.errors import InvalidArgument

FIELDS = ("position", "velocity", "effort")


class JointSelector:
    """Picks ``fields`` of ``joint_names`` (in that order) out of a JointState's arrays."""

    def __init__(self, joint_names: Sequence[str], fields: Sequence[str] = ("position",)) -> None:
        if not joint_names:
            raise InvalidArgument("joint_names is empty: name the joints the policy observes")
        if len(set(joint_names)) != len(joint_names):
            raise InvalidArgument(f"joint_names has duplicates: {list(joint_names)}")
        bad = [f for f in fields if f not in FIELDS]
        if bad or not fields:
            raise InvalidArgument(f"joint fields must be some of {FIELDS}, got {list(fields)}")
        self.joint_names, self.fields = list(joint_names), list(fields)
        self._index_cache: tuple[tuple[str, ...], list[int]] | None = None

    @property
    def size(self) -> int:
        return len(self.joint_names) * len(self.fields)

    def problem(self, names: Sequence[str], arrays: dict[str, Sequence[float]]) -> str | None:
        """Why a JointState cannot be used (a joint missing, an array too short), or None. Cheap
        (the joint order is cached): checked on every message at receipt."""
        try:
            self._indices(tuple(names))
        except InvalidArgument as exc:
            return str(exc)
        for field in self.fields:
            values = arrays.get(field, ())
            if len(values) != len(names):
                return f"JointState has {len(names)} names but {len(values)} {field} values"
        return None

    def select(self, names: Sequence[str], arrays: dict[str, Sequence[float]]) -> torch.Tensor:
        """float32 ``(len(fields) * len(joint_names),)``: field-major (all positions, then velocities)."""
        index = self._indices(tuple(names))
        out = []
        for field in self.fields:
            values = arrays.get(field, ())
            if len(values) != len(names):
                raise InvalidArgument(f"JointState has {len(names)} names but {len(values)} "
                                      f"{field} values")
            out.extend(float(values[i]) for i in index)
        return torch.tensor(out, dtype=torch.float32)

    def _indices(self, names: tuple[str, ...]) -> list[int]:
        if self._index_cache is not None and self._index_cache[0] == names:
            return self._index_cache[1]
        where = {n: i for i, n in enumerate(names)}
        missing = [n for n in self.joint_names if n not in where]
        if missing:
            raise InvalidArgument(f"JointState lacks joint(s) {missing} of input_joint_names "
                                  f"(it has {list(names)})")
        index = [where[n] for n in self.joint_names]
        self._index_cache = (names, index)
        return index


def state_from_array(values: Sequence[float]) -> torch.Tensor:
    """A ``Float32MultiArray``'s data as the float32 state vector."""
    return torch.tensor(list(values), dtype=torch.float32)


def length_problem(count: int, expected: int, feature: str) -> str | None:
    """Why an array of ``count`` values cannot feed ``feature`` of ``expected`` values, or None."""
    if count == expected:
        return None
    return f"the message has {count} values but the policy's {feature} takes {expected}"
