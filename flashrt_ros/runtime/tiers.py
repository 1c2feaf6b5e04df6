"""Storage tiers: byte budgets for device memory, (pinned) host memory and a disk directory.

Why budgets are checked before allocating: an out-of-memory error in the
middle of serving would take the engine down with it. Every tier keeps its own
account of the bytes it holds; the store asks ``fits`` before it allocates and
turns the rare real allocator failure into ``BudgetExhausted``.

On a machine without CUDA the "device" tier is simply the arena's device (CPU
memory) and the host tier is plain, unpinned CPU memory: both work, they just
cost the same. With CUDA the host tier allocates pinned memory, so host<->device
copies run at full PCIe/NVLink-C2C speed and can be asynchronous.

Every tier counts ``Capsule.nbytes`` (the payload size, alignment padding
included), so a capsule costs the same in every tier. The disk tier's account
covers the tensor bytes of capsules this store knows to be on disk, not file
headers or manifests (a few KB each).
"""
from __future__ import annotations

from pathlib import Path

import torch

from flashrt_ros.runtime.errors import BudgetExhausted, InvalidArgument


class Tier:
    """A named byte budget."""

    def __init__(self, name: str, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise InvalidArgument(f"{name} budget must be >= 0, got {budget_bytes}")
        self.name = name
        self.budget = int(budget_bytes)
        self.used = 0

    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.budget

    @property
    def free(self) -> int:
        return self.budget - self.used

    def charge(self, nbytes: int) -> None:
        self.used += nbytes

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        assert self.used >= 0, f"{self.name} tier accounting went negative"


class MemoryTier(Tier):
    """Device or host memory; hands out flat uint8 payloads."""

    def __init__(self, name: str, budget_bytes: int, device: torch.device, pin: bool) -> None:
        super().__init__(name, budget_bytes)
        self.device = torch.device(device)
        self.pin = pin

    def allocate(self, nbytes: int) -> torch.Tensor:
        """Allocate a payload (charged to the budget by the caller)."""
        try:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device, pin_memory=self.pin)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            if not isinstance(exc, torch.OutOfMemoryError) and "memory" not in str(exc).lower():
                raise
            raise BudgetExhausted(
                f"{self.name} tier: allocator refused {nbytes} bytes although the budget allowed it "
                f"({type(exc).__name__}); lower the {self.name} budget") from None


class DiskTier(Tier):
    """A capsule directory; ``directory`` is None when the store has no disk tier."""

    def __init__(self, budget_bytes: int, directory: Path | None) -> None:
        super().__init__("disk", budget_bytes if directory is not None else 0)
        self.directory = None if directory is None else Path(directory)
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.directory is not None


def make_memory_tiers(device: torch.device, device_budget: int, host_budget: int) -> tuple[MemoryTier, MemoryTier]:
    """The device tier lives on the arena's device; the host tier is pinned when CUDA exists."""
    device = torch.device(device)
    pin = torch.cuda.is_available()
    return (MemoryTier("device", device_budget, device, pin=False),
            MemoryTier("host", host_budget, torch.device("cpu"), pin=pin))
