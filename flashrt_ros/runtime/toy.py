"""A tiny deterministic stand-in engine over a realistic arena, for tests and benchmarks.

Why: capsule semantics (byte-exact restore, rollback, sessions, concurrency)
must be provable in milliseconds on a CPU, without a model. The toy arena has
what a hybrid LLM has: int64 meta scalars, append-only KV caches (one laid out
row-major so its live extent is a byte prefix, one head-major so it is
strided), recurrent and conv state of other dtypes, and raw rng bytes. Each
``step`` appends a KV row and updates every other buffer as a function of the
whole state, so any missing or stale byte changes the future.
"""
from __future__ import annotations

import time

import torch

from flashrt_ros.runtime.arena import BOUNDARY, POSITION, BufferSpec, StateArena, core_meta_specs


def toy_specs(*, layers: int = 2, max_len: int = 16, heads: int = 2, dim: int = 4) -> list[BufferSpec]:
    specs = core_meta_specs()
    for i in range(layers):
        specs += [
            BufferSpec(f"kv.{i}", (max_len, heads, dim), torch.float32, group="kv", live_axis=0,
                       length_from=POSITION, append_only=True, doc="row-major KV: live extent is a prefix"),
            BufferSpec(f"kvh.{i}", (heads, max_len, dim), torch.bfloat16, group="kv", live_axis=1,
                       length_from=POSITION, append_only=True, doc="head-major KV: strided live extent"),
            BufferSpec(f"rec.{i}", (heads, dim, dim), torch.float32, group="recurrent"),
            BufferSpec(f"conv.{i}", (3, heads * dim), torch.float16, group="conv"),
        ]
    specs.append(BufferSpec("rng.state", (16,), torch.uint8, group="rng"))
    specs.append(BufferSpec("policy.pending", (4,), torch.int32, group="policy"))
    return specs


def toy_arena(device: torch.device | str = "cpu", **kwargs) -> StateArena:
    return StateArena(toy_specs(**kwargs), device=device)


def live_bytes(arena: StateArena) -> dict[str, bytes]:
    """Every buffer's live extent as raw bytes (what must survive a capsule round trip)."""
    out = {}
    for name in arena:
        t = arena.live_view(name).contiguous().reshape(-1)
        out[name] = t.view(torch.uint8).cpu().numpy().tobytes() if t.numel() else b""
    return out


class ToyEngine:
    """Deterministic 'greedy decode' over the toy arena; one token per ``step``."""

    def __init__(self, arena: StateArena) -> None:
        self.arena = arena
        self.layers = sum(1 for n in arena if n.startswith("rec."))

    def prefill(self, n: int) -> None:
        for _ in range(n):
            self.step()

    def step(self, *, yield_between: bool = False) -> int:
        """Append one position; ``yield_between`` sleeps between writes to expose torn reads."""
        a = self.arena
        pos = int(a[POSITION].item())
        rng = a["rng.state"]
        token = int(rng.to(torch.int64).sum().item() + pos * 7) % 251
        for i in range(self.layers):
            rec, conv = a[f"rec.{i}"], a[f"conv.{i}"]
            feat = torch.tanh(rec.sum(-1) + token / 251.0 + 0.1 * conv[-1].float().view_as(rec.sum(-1))
                              + 0.01 * (i + 1))
            a[f"kv.{i}"][pos].copy_(feat)
            if yield_between:
                time.sleep(0)
            a[f"kvh.{i}"][:, pos].copy_(feat.to(torch.bfloat16))
            rec.mul_(0.5).add_(torch.einsum("hd,he->hde", feat, feat) * 0.25)
            conv.copy_(torch.roll(conv, -1, dims=0))
            conv[-1].copy_(feat.reshape(-1).to(torch.float16))
            if yield_between:
                time.sleep(0)
        rng.copy_(((rng.to(torch.int64) * 73 + 41 + token) % 256).to(torch.uint8))
        a["policy.pending"].copy_(torch.tensor([token, pos, token ^ pos, 0], dtype=torch.int32))
        if yield_between:
            time.sleep(0)
        a[POSITION].add_(1)
        a[BOUNDARY].add_(1)
        return token
