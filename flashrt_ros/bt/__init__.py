"""Behaviour trees over the flashrt node's services and actions (non-blocking ticks).

``flashrt_ros.bt`` is the py_trees front-end; ``flashrt_ros.bt.btcpp`` registers the
same verbs as BehaviorTree.CPP v4 nodes (through ``behaviortreepy``). Both run on the
request/response core in ``flashrt_ros.bt.requests``.
"""
from flashrt_ros.bt.behaviours import (Fork, Generate, GoalBehaviour, InputsFresh, IsPolicyPaused, PausePolicy,
                                       PolicyPaused, Reset, Restore, ResumePolicy, Rollback, RunPolicy,
                                       ServiceBehaviour, Snapshot, StatusCondition, SwitchSession)
from flashrt_ros.bt.requests import DEFAULT_TIMEOUT_S, GoalRequest, Progress, ServiceRequest

__all__ = ["DEFAULT_TIMEOUT_S", "Fork", "Generate", "GoalBehaviour", "GoalRequest", "InputsFresh",
           "IsPolicyPaused", "PausePolicy", "PolicyPaused", "Progress", "Reset", "Restore", "ResumePolicy",
           "Rollback", "RunPolicy", "ServiceBehaviour", "ServiceRequest", "Snapshot", "StatusCondition",
           "SwitchSession"]
