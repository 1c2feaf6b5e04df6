"""Engine construction: the LLMEngine or PolicyEngine a node's parameters ask for.

Why here and nothing else: the node should not know how weights are loaded,
devices and dtypes resolved or budgets converted; once built, it talks to the
engine's own API (``engine.capsules`` for every capsule verb, ``generate`` or
``step``), so no adapter restates those verbs.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import torch

from flashrt_ros.runtime.errors import InvalidArgument

if TYPE_CHECKING:
    from flashrt_ros.engine.chunk_planner import ReplanConfig
    from flashrt_ros.engine.llm_engine import LLMEngine
    from flashrt_ros.engine.policy_engine import PolicyEngine

MiB = 1 << 20


def resolve_device(name: str) -> torch.device:
    """The device ``name`` names (``auto``: CUDA if available); a CUDA device this torch has no kernels
    for is refused here, naming the GPU and what to install (``cuda_arch``), not in its first kernel."""
    from flashrt_ros.engine.cuda_arch import check_device
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise InvalidArgument(f"device {name!r} requested but CUDA is not available")
    check_device(device)
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


def replan_config(config: Any) -> "ReplanConfig":
    """The policy engine's replanning settings from the node's parameters (sync when it has none; ``auto``
    is resolved when the engine is built: ``replan_choice``)."""
    from flashrt_ros.engine.chunk_planner import ReplanConfig
    mode = getattr(config, "replan", "sync")
    if mode == "sync":
        return ReplanConfig()
    return ReplanConfig(mode=mode, delay_steps=config.replan_delay_steps, blend_steps=config.replan_blend_steps,
                        late=config.replan_late, period_s=1.0 / config.control_rate_hz,
                        rtc_horizon=config.rtc_execution_horizon, rtc_schedule=config.rtc_prefix_attention_schedule,
                        rtc_max_weight=config.rtc_max_guidance_weight)


def build_engine(config: Any, log: Callable[[str], None] = print, *,
                 lockstep: bool = False) -> Union["LLMEngine", "PolicyEngine"]:
    """Construct the engine for a NodeConfig (loads weights, allocates the arena); ``lockstep``: the policy
    steps once per observation (``control_trigger: inputs``), so ``replan: auto`` plans in the step."""
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
        speculative = getattr(config, "speculative_tokens", 0)
        model, tokenizer, _config, fingerprint_inputs = load_model(config.model, device, dtype, mtp=speculative > 0)
        log(f"model loaded in {time.perf_counter() - t0:.1f} s; allocating arena "
            f"(max_context {config.max_context}" + (f", {speculative} speculative tokens" if speculative else "")
            + ")")
        engine = LLMEngine(model, tokenizer, max_context=config.max_context, device=device,
                           prefill_chunk=config.prefill_chunk, fingerprint_inputs=fingerprint_inputs,
                           speculative_tokens=speculative,
                           cuda_graphs=device.type == "cuda", verb_timeout_s=config.boundary_timeout_s,
                           store_config=StoreConfig(directory=directory, rollback_depth=config.rollback_depth,
                                                    default_tier=config.default_tier, **budgets))
        if engine.cuda_graphs:
            t0 = time.perf_counter()
            captured = engine.warm_up()
            log(f"captured {captured} CUDA graphs (decode, draw, " + ("verify, " if speculative else "")
                + f"prefill lengths up to {config.prefill_chunk}) in {time.perf_counter() - t0:.1f} s")
        return engine
    if config.engine_kind == "policy":
        from flashrt_ros.engine.policy_engine import PolicyEngine
        from flashrt_ros.models.policy_factory import LEROBOT_PREFIX, make_policy

        # 'auto' keeps policies in float32 (their parity is checked in fp32) except π0 / π0.5 on CUDA
        # (bfloat16); an explicit dtype runs a LeRobot checkpoint's networks in it
        policy_dtype = dtype
        if config.dtype == "auto":
            policy_dtype = torch.float32
            if config.policy.startswith(LEROBOT_PREFIX):
                from flashrt_ros.models.lerobot import default_dtype
                policy_dtype = default_dtype(config.policy[len(LEROBOT_PREFIX):], device)
        numerics = config.numerics
        if numerics == "auto":
            from flashrt_ros.models.lerobot import default_numerics
            numerics = default_numerics(device)
        policy = make_policy(config.policy, policy_dtype, numerics)
        fast = getattr(policy, "fast", None) if getattr(policy, "numerics", "exact") != "exact" else None
        if fast is not None and hasattr(fast, "attention"):
            fast.attention = getattr(config, "vla_attention", "sdpa")     # π0 / π0.5 (read at every plan)
        if config.policy_instruction:
            if not hasattr(policy, "set_default_instruction"):
                raise InvalidArgument(f"policy_instruction: {type(policy).__name__} takes no language instruction")
            policy.set_default_instruction(config.policy_instruction)
        from flashrt_ros.engine.replan_choice import choose_replan
        replan = choose_replan(policy, device, replan_config(config), lockstep=lockstep)
        if replan.chosen:
            log(f"replan {replan.chosen}")
        engine = PolicyEngine(policy, device=device, directory=str(directory),
                              rollback_depth=config.rollback_depth, default_tier=config.default_tier,
                              cuda_graph=device.type == "cuda", gate_timeout_s=config.boundary_timeout_s,
                              replan=replan, **budgets)
        return engine
    raise InvalidArgument(f"engine_kind must be llm or policy (got {config.engine_kind!r})")
