"""Build the engine a node's parameters ask for, behind one node-facing interface.

Why an adapter: the ROS node must not know two engine APIs (or any tensors).
``EngineHost`` gives it one set of verbs — the capsule verbs, ``status``,
``generate`` (LLM) and ``step`` (policy, plain float lists in and out) — and
translates each engine's return values into what the services report.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from flashrt_ros.runtime.arena import POSITION
from flashrt_ros.runtime.errors import InvalidArgument

MiB = 1 << 20


@dataclass
class GenerateOutcome:
    text: str
    token_ids: list[int]
    stop_reason: str
    position: int
    ttft_ms: float
    tokens_per_second: float


@dataclass
class VerifyOutcome:
    intact: bool
    matches_live: bool
    differing_buffers: list[str]
    verified: bool = True       # False: no hashes were recorded before (nothing to compare)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidArgument(f"device {name!r} requested but CUDA is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise InvalidArgument(f"unknown dtype {name!r}") from None


def capsule_directory(path: str) -> Path:
    directory = Path(os.path.expanduser(path)).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def build_engine(config: Any, log: Callable[[str], None] = print) -> "EngineHost":
    """Construct the engine for a NodeConfig (loads weights, allocates the arena)."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    directory = capsule_directory(config.capsule_directory)
    budgets = dict(device_budget_bytes=config.capsule_device_budget_mb * MiB,
                   host_budget_bytes=config.capsule_host_budget_mb * MiB,
                   disk_budget_bytes=config.capsule_disk_budget_mb * MiB)
    if config.engine_kind == "llm":
        from flashrt_ros.engine.config import StoreConfig
        from flashrt_ros.engine.llm_engine import LLMEngine
        from flashrt_ros.models.registry import load_model

        log(f"loading model {config.model!r} on {device} ({dtype})")
        t0 = time.perf_counter()
        model, tokenizer, _config, fingerprint_inputs = load_model(config.model, device, dtype)
        log(f"model loaded in {time.perf_counter() - t0:.1f} s; allocating arena "
            f"(max_context {config.max_context})")
        engine = LLMEngine(model, tokenizer, max_context=config.max_context, device=device,
                           prefill_chunk=config.prefill_chunk, fingerprint_inputs=fingerprint_inputs,
                           cuda_graphs=device.type == "cuda", verb_timeout_s=config.boundary_timeout_s,
                           store_config=StoreConfig(directory=directory, rollback_depth=config.rollback_depth,
                                                    default_tier=config.default_tier, **budgets))
        if engine.cuda_graphs:
            t0 = time.perf_counter()
            captured = engine.warm_up()
            log(f"captured {captured} CUDA graphs (decode, draw, prefill lengths up to "
                f"{config.prefill_chunk}) in {time.perf_counter() - t0:.1f} s")
        return EngineHost(engine, "llm", config.model, directory)
    if config.engine_kind == "policy":
        from flashrt_ros.engine.policy_engine import PolicyEngine
        from flashrt_ros.models.policies import make_policy

        policy = make_policy(config.policy)
        engine = PolicyEngine(policy, device=device, directory=str(directory),
                              rollback_depth=config.rollback_depth, default_tier=config.default_tier,
                              cuda_graph=device.type == "cuda", gate_timeout_s=config.boundary_timeout_s,
                              **budgets)
        return EngineHost(engine, "policy", config.policy, directory)
    raise InvalidArgument(f"engine_kind must be llm or policy (got {config.engine_kind!r})")


class EngineHost:
    """The node-facing verbs over an LLMEngine or a PolicyEngine."""

    def __init__(self, engine: Any, kind: str, model: str, directory: Path) -> None:
        self.engine, self.kind, self.model, self.directory = engine, kind, model, directory
        self.gate = engine.gate
        self._stop_requested = False

    def describe(self) -> str:
        return (f"{self.kind} engine, model {self.model}, device {self.engine.device}, "
                f"arena {self.engine.arena.nbytes / MiB:.1f} MiB, capsules in {self.directory}")

    # --- capsule verbs ----------------------------------------------------
    def snapshot(self, name: str, *, session: str | None, tier: str, pinned: bool,
                 overwrite: bool) -> Any:
        return self.engine.snapshot(name, session=session or "default", tier=tier, pinned=pinned,
                                    overwrite=overwrite)

    def restore(self, name: str, *, verify: bool) -> Any:
        return self.engine.restore(name, verify=verify)

    def fork(self, source: str, name: str, *, tier: str) -> Any:
        return self.engine.fork(source, name, tier=tier)

    def rollback(self, steps: int) -> Any:
        return self.engine.rollback(steps)

    def drop(self, name: str) -> None:
        self.engine.drop(name)

    def list(self) -> list[Any]:
        return list(self.engine.list())

    def save(self, name: str) -> tuple[Any, Path]:
        info = self.engine.save(name)
        return info, self.directory / f"{info.name}.safetensors"

    def load(self, name: str) -> Any:
        return self.engine.load(name)

    def verify(self, name: str, *, against_live: bool) -> VerifyOutcome:
        stored = self.engine.verify(name, against_live=False)
        live_ok, differing = False, list(stored.mismatched)
        if against_live:
            live = self.engine.verify(name, against_live=True)
            live_ok, differing = live.ok, list(live.mismatched)
        return VerifyOutcome(intact=stored.ok, matches_live=live_ok, differing_buffers=differing,
                             verified=stored.verified)

    def reset(self) -> None:
        self.engine.reset()

    def stats(self) -> dict[str, Any]:
        return _tier_bytes(self.engine.store.stats())

    # --- status -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        raw = self.engine.status()
        # The LLM engine keys latency by step kind; the policy engine has one flat entry.
        step = raw["latency"].get("decode", {}) if self.kind == "llm" else raw["latency"]
        store = _tier_bytes(raw["store"])
        return {
            "engine_kind": self.kind, "model": self.model, "device": str(self.engine.device),
            "session": "default",
            "busy": bool(raw.get("generating", False)),
            "position": int(raw["position"]),
            "boundary_id": int(raw["boundary"]),
            "capsule_count": store["count"],
            "arena_bytes": int(self.engine.arena.nbytes),
            "live_bytes": int(raw.get("live_bytes", 0)),
            "device_bytes": store["device_bytes"], "host_bytes": store["host_bytes"],
            "disk_bytes": store["disk_bytes"],
            "step_p50_ms": float(step.get("p50_ms", 0.0)),
            "step_p99_ms": float(step.get("p99_ms", 0.0)),
        }

    # --- work ---------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask a running generation to stop at its next boundary."""
        self._stop_requested = True

    def generate(self, prompt: str, *, max_new_tokens: int, temperature: float, top_k: int,
                 top_p: float, seed: int, chat: bool, reset: bool,
                 on_token: Callable[[int, str, int], None],
                 should_stop: Callable[[], bool]) -> GenerateOutcome:
        if self.kind != "llm":
            raise InvalidArgument("generate needs engine_kind=llm")
        from flashrt_ros.engine.sampling import SamplingParams

        self._stop_requested = False
        # Every check that can refuse the request runs before reset writes anything.
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                  seed=seed if seed else None)
        if reset and not prompt:
            raise InvalidArgument("reset with an empty prompt: there would be nothing to continue from")
        if reset:
            self.engine.reset()
        position_buffer = self.engine.arena[POSITION]

        def report(token: int, piece: str) -> None:
            # Called after the step's body, before its commit: the token is pending,
            # so the transcript holds position + 1 tokens.
            on_token(token, piece, int(position_buffer.item()) + 1)

        result = self.engine.generate(
            prompt, max_new_tokens=max_new_tokens, sampling=sampling, chat=chat and bool(prompt),
            on_token=report,
            should_stop=lambda: self._stop_requested or should_stop())
        t = result.timings
        status = self.engine.status()
        transcript_length = int(status["position"]) + int(status["has_pending"])
        return GenerateOutcome(text=result.text, token_ids=list(result.token_ids),
                               stop_reason=result.stop_reason, position=transcript_length,
                               ttft_ms=1e3 * t.get("ttft_s", 0.0),
                               tokens_per_second=t.get("decode_tokens_per_s", 0.0))

    def step(self, observation: Sequence[float]) -> list[float]:
        if self.kind != "policy":
            raise InvalidArgument("step needs engine_kind=policy")
        expected = self.engine.policy.obs_dim
        if len(observation) != expected:
            raise InvalidArgument(f"observation has {len(observation)} values, policy expects {expected}")
        obs = torch.tensor(observation, dtype=torch.float32)
        return self.engine.step(obs).tolist()

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()


def _tier_bytes(stats: dict[str, Any]) -> dict[str, Any]:
    """The store's stats ({tier: {bytes, count}}, capsules) as flat byte counts."""
    out: dict[str, Any] = {"count": int(stats.get("capsules", 0) or 0) - int(stats.get("hidden", 0) or 0)}
    for tier in ("device", "host", "disk"):
        entry = stats.get(tier)
        out[f"{tier}_bytes"] = int(entry.get("bytes", 0)) if isinstance(entry, dict) else 0
    return out
