"""Behaviour trees over the flashrt node's services and actions (non-blocking ticks).

``flashrt_ros.bt`` is the py_trees front-end; ``flashrt_ros.bt.btcpp`` registers the
same verbs as BehaviorTree.CPP v4 nodes (through ``behaviortreepy``). Both run on the
request/response core in ``flashrt_ros.bt.requests``. The capsule verbs' behaviours
(``Snapshot``, ``Restore``, ``Fork``, ``Drop``, ``Rollback``, ``Reset``, ``SwitchSession``,
``PausePolicy``, ``ResumePolicy``) are made from ``flashrt_ros/interface/services.py``.
"""
from flashrt_ros.bt import behaviours
# every name in behaviours.__all__ (the verbs' classes are made there, from interface/services.py)
from flashrt_ros.bt.behaviours import *  # noqa: F401,F403
from flashrt_ros.bt.requests import DEFAULT_TIMEOUT_S, GoalRequest, Progress, ServiceRequest

__all__ = sorted(["DEFAULT_TIMEOUT_S", "GoalRequest", "Progress", "ServiceRequest", *behaviours.__all__])
