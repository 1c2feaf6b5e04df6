"""Speculative verification of the hybrid decoder: keep every token's recurrent state, then keep one.

Why: a verification forward feeds the pending token and ``k`` drafted tokens at
once. The attention KV of rejected tokens needs no undo (rows past the position
are never read), but the Gated DeltaNet recurrent matrices and conv windows have
absorbed every fed token. Instead of snapshotting before and recomputing after a
rejection (a second forward whose length depends on the verdict, so one graph per
length and a host sync to pick it), verification writes the state after *each*
token into this scratch, and ``keep_prefix`` copies back the one after the
last accepted token: a fixed-shape gather on the device, inside the same captured
step, whatever was accepted. Its cost per Gated DeltaNet layer is writing
``T`` state tiles during the forward and copying one back (for the 0.81B shape at
``T = 4``: 4 MB written, 2 MB copied per layer).

The scratch is not state: it is meaningful only inside the step that fills it,
so it lives beside the arena (fixed addresses for the graphs), never in a capsule.
"""
from __future__ import annotations

import torch

from flashrt_ros.models.hybrid.config import HybridConfig
from flashrt_ros.runtime.arena import StateArena


class VerifyScratch:
    """Per-token states of one verification of up to ``tokens`` tokens, for every Gated DeltaNet layer.

    ``recurrent[name] [tokens, Hv, dk, dv]`` float32: the state after token ``i``;
    ``conv[name] [conv_dim, K-1+tokens]``: the conv window before the tokens
    followed by their conv inputs, so the window after token ``i`` is columns
    ``i+1 .. i+K-1``.
    """

    def __init__(self, cfg: HybridConfig, linear_layers: list[int], tokens: int, conv_dtype: torch.dtype,
                 device: torch.device | str) -> None:
        if tokens < 1:
            raise ValueError("a verification feeds at least one token")
        self.tokens = tokens
        window = cfg.linear_conv_kernel_dim - 1
        self.recurrent = {
            f"layers.{i}.gdn.recurrent": torch.zeros(
                (tokens, cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim),
                dtype=torch.float32, device=device)
            for i in linear_layers}
        self.conv = {f"layers.{i}.gdn.conv": torch.zeros((cfg.conv_dim, window + tokens), dtype=conv_dtype,
                                                         device=device)
                     for i in linear_layers}
        self._window_after = torch.arange(1, window + 1, device=device)     # columns after token 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.recurrent.values(), *self.conv.values()))

    def keep_prefix(self, arena: StateArena, last: torch.Tensor) -> None:
        """Set every layer's recurrent and conv state to the one after token ``last`` (int64 0-d tensor).

        Device-side gathers only (no host read), so it can be captured.
        """
        index = last.view(1)
        for name, states in self.recurrent.items():
            arena[name].copy_(states.index_select(0, index).squeeze(0))
        columns = self._window_after + last
        for name, window in self.conv.items():
            arena[name].copy_(window.index_select(1, columns))
