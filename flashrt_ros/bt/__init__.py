"""py_trees behaviours over the flashrt node's services (non-blocking ticks)."""
from flashrt_ros.bt.behaviours import (Fork, Generate, PausePolicy, PolicyPaused, Restore, ResumePolicy, Rollback,
                                       ServiceBehaviour, ServiceCall, Snapshot)

__all__ = ["Fork", "Generate", "PausePolicy", "PolicyPaused", "Restore", "ResumePolicy", "Rollback",
           "ServiceBehaviour", "ServiceCall", "Snapshot"]
