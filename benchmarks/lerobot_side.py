"""LeRobot's side of the race: each way LeRobot 0.4.4 can run a policy, built and stepped as its users do.

Why several modes: a fair speed-up divides by LeRobot at its fastest for the
precision, not by its eager defaults. A *mode* is one of

* ``eager`` (fp32) and ``autocast`` (bf16: ``torch.autocast``, as
  ``lerobot_eval --policy.use_amp=true``);
* ``compiled`` / ``autocast-compiled``: LeRobot's own ``compile_model`` where the
  policy has one (Diffusion Policy compiles its UNet, SmolVLA its
  ``sample_actions`` and ``forward``; the policy is constructed with the flag
  set and given the eager policy's weights), otherwise (ACT)
  ``torch.compile(policy.model)``; mode ``--compile-mode`` (reduce-overhead:
  CUDA graphs on a GPU);
* ``compiled-default`` / ``autocast-compiled-default``: the same with
  ``mode="default"`` (no CUDA graphs);
* ``bf16-weights`` (+ ``-compiled``): SmolVLA's VLM in bf16, which is how
  LeRobot loads a pretrained SmolVLA (``load_vlm_weights=True`` reads the VLM
  with ``torch_dtype="bfloat16"``; the action expert stays fp32). ACT and
  Diffusion Policy do not run with bf16 weights in LeRobot 0.4.4 (their code
  makes fp32 tensors inside; measured: "mat1 and mat2 must have the same
  dtype"), so they have no such mode.

A step is what a ``lerobot_eval`` user pays: the observation (host tensors, as
its env wrapper makes them) through the policy's pre-processor (batch dim,
device, normalisation; SmolVLA also tokenises the task), ``select_action``
under ``torch.inference_mode()``, the post-processor (unnormalisation, to the
CPU). Injected noise: Diffusion Policy and SmolVLA take the plan's initial
noise through ``select_action(noise=...)``.
"""
from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.timing import sync


@dataclass(frozen=True)
class Mode:
    """One way of running LeRobot's policy."""

    key: str                    # e.g. "autocast-compiled"
    precision: str              # "fp32" or "bf16": the headline it competes in
    compile_mode: str | None    # torch.compile mode, None: eager
    autocast: bool              # torch.autocast(bf16) around the step
    bf16_weights: bool          # weights cast (SmolVLA: its VLM) to bf16
    optional: bool = False      # dropped first when the time budget is short


#: every mode by key; ``"compiled"`` modes take ``--compile-mode`` (set in ``modes``)
MODE_KEYS = ("eager", "compiled", "compiled-default", "autocast", "autocast-compiled", "autocast-compiled-default",
             "bf16-weights", "bf16-weights-compiled")
DEFAULT_MODES = {
    "fp32": ("eager", "compiled", "compiled-default"),
    "bf16": ("autocast", "autocast-compiled", "bf16-weights", "bf16-weights-compiled"),
}
OPTIONAL = ("compiled-default", "autocast-compiled-default", "bf16-weights-compiled")
#: LeRobot runs bf16 weights only for SmolVLA's VLM (its pretrained loading dtype)
BF16_WEIGHTS_KINDS = ("smolvla",)


def modes(kind: str, precision: str, keys: tuple[str, ...] | None = None,
          compile_mode: str = "reduce-overhead") -> list[Mode]:
    """The LeRobot modes that compete in ``precision`` for policy ``kind`` (``keys``: a subset of ``MODE_KEYS``)."""
    chosen = DEFAULT_MODES[precision] if keys is None else tuple(k for k in keys if k in DEFAULT_MODES[precision])
    out = []
    for key in chosen:
        if key.startswith("bf16-weights") and kind not in BF16_WEIGHTS_KINDS:
            continue
        cm = None
        if key.endswith("compiled"):
            cm = compile_mode
        elif key.endswith("compiled-default"):
            cm = "default"
        out.append(Mode(key, precision, cm, autocast=key.startswith("autocast"),
                        bf16_weights=key.startswith("bf16-weights"), optional=key in OPTIONAL))
    return out


def _load_like(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """``source``'s weights into ``target`` strictly, across ``torch.compile``'s ``_orig_mod.`` key prefix."""
    src = source.state_dict()
    state = {k: src[k.replace("._orig_mod", "")] for k in target.state_dict()}
    target.load_state_dict(state, strict=True)


def build_policy(kind: str, eager, mode: Mode):
    """LeRobot's policy for ``mode`` on the CPU (the caller moves it): shares ``eager`` when nothing changes."""
    if mode.compile_mode is None and not mode.bf16_weights:
        return eager
    if mode.compile_mode is not None and kind in ("diffusion", "smolvla"):
        config = copy.deepcopy(eager.config)
        config.compile_model, config.compile_mode = True, mode.compile_mode
        torch.manual_seed(0)
        policy = type(eager)(config)                # LeRobot's own compile_model path
        _load_like(policy, eager)
    else:
        policy = copy.deepcopy(eager)
        if mode.compile_mode is not None:           # ACT has no compile_model: compile its model
            policy.model = torch.compile(policy.model, mode=mode.compile_mode)
    if mode.bf16_weights:
        policy.model.vlm_with_expert.vlm.to(torch.bfloat16)
    return policy.eval()


def processors(directory: Path, device: torch.device):
    """The checkpoint's pre/post-processors as ``lerobot_eval`` loads them (pre-processor on ``device``)."""
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
    pre = PolicyProcessorPipeline.from_pretrained(directory, config_filename="policy_preprocessor.json",
                                                  overrides={"device_processor": {"device": str(device)}})
    post = PolicyProcessorPipeline.from_pretrained(
        directory, config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition, to_output=transition_to_policy_action)
    return pre, post


def will_replan(policy) -> bool:
    """Whether LeRobot's next ``select_action`` predicts a chunk (its action queue is empty)."""
    queue = getattr(policy, "_action_queue", None)
    if queue is None:
        queue = policy._queues["action"]
    return len(queue) == 0


class LeRobotSide:
    """One LeRobot mode ready to step: its policy on the device and its own processors.

    ``extra``: keys added to every observation before the pre-processor (SmolVLA's
    ``"task"``). ``takes_noise``: the policy's ``select_action`` accepts ``noise=``.
    """

    def __init__(self, kind: str, mode: Mode, policy, directory: Path, device: torch.device,
                 extra: dict[str, Any] | None = None) -> None:
        self.kind, self.mode, self.device = kind, mode, device
        self.name = f"LeRobot {mode.key}" + (f" ({mode.compile_mode})" if mode.compile_mode else "")
        self.policy = policy.to(device)
        self.pre, self.post = processors(directory, device)
        self.extra = dict(extra or {})
        self.takes_noise = kind in ("diffusion", "smolvla")
        self._autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if mode.autocast
                          else contextlib.nullcontext())

    def reset(self, seed: int) -> None:
        self.policy.reset()

    def will_replan(self) -> bool:
        return will_replan(self.policy)

    def step(self, obs: dict[str, torch.Tensor], noise: torch.Tensor | None) -> torch.Tensor:
        """pre-processor -> select_action (inference_mode) -> post-processor; the action on the host."""
        with torch.no_grad(), self._autocast:
            batch = self.pre({**obs, **self.extra})
            kwargs = {"noise": noise} if noise is not None and self.takes_noise else {}
            with torch.inference_mode():
                action = self.policy.select_action(batch, **kwargs)
            action = self.post(action)
        sync(self.device)
        return action

    def close(self) -> None:
        self.policy.to("cpu")


def compile_counters() -> dict[str, int]:
    """A flat copy of torch's compile counters (``torch._dynamo.utils.counters``): frames compiled, graphs,
    graph breaks, recompiles, CUDA-graph skips, cache hits."""
    from torch._dynamo.utils import counters
    return {f"{group}.{name}": int(n) for group, named in counters.items() for name, n in named.items()}


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] != before.get(k, 0)}


def compiles_in(delta: dict[str, int]) -> int:
    """Frames dynamo compiled (first compiles and recompiles) in a counter delta."""
    return delta.get("frames.total", 0)


def warm_up(run_episode: Callable[[], Any], compiled: bool, min_episodes: int, max_episodes: int) -> dict[str, Any]:
    """Episodes until compiling stops: an episode that compiled nothing ends the warm-up (at least
    ``min_episodes``; at most ``max_episodes``). Returns the warm-up time and what was compiled."""
    start = compile_counters()
    t0 = time.perf_counter()
    episodes, quiet = 0, True
    for episodes in range(1, max(max_episodes, min_episodes) + 1):
        before = compile_counters()
        run_episode()
        quiet = compiles_in(counter_delta(before, compile_counters())) == 0
        if episodes >= min_episodes and (quiet or not compiled):
            break
    delta = counter_delta(start, compile_counters())
    return {"warmup_s": time.perf_counter() - t0, "warmup_episodes": episodes, "settled": quiet or not compiled,
            "compiled_frames": compiles_in(delta), "counters": delta}


def timed_episodes(episode: Callable[..., dict], spec: dict, device: torch.device, tag: str,
                   **extra: Any) -> None:
    """A LeRobot reference process's run (``test/pi_reference/bench.py``, ``test/groot_reference/bench.py``):
    warm-up (a compiled policy: until an episode compiles nothing), ``spec["episodes"]`` timed episodes of
    ``spec["steps"]``, then the checked episode of ``spec["check_steps"]`` (``episode(n, keep=True)`` returns its
    ``actions``). Writes the actions to ``spec["out"]``'s ``.safetensors`` and the runs, peak device memory,
    first episode (compilation included), warm-up and ``extra`` to ``spec["out"]`` (JSON)."""
    import json

    from safetensors.torch import save_file
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    runs: list[dict] = []
    compiled = bool(spec["compile_model"])
    warm = warm_up(lambda: runs.append(episode(spec["steps"])), compiled,
                   max(spec["warmup"], 2 if compiled else 0), spec.get("compile_warmup_max", 6) if compiled
                   else spec["warmup"]) if spec["warmup"] else {"warmup_s": 0.0, "warmup_episodes": 0, "settled": True}
    first_episode_ms = runs[0]["episode_ms"] if runs else None              # compilation included
    runs = []
    for i in range(spec["episodes"]):
        runs.append(episode(spec["steps"]))
        print(f"[{tag}] {spec['name']}: episode {i} {runs[-1]['episode_ms']:.1f} ms", flush=True)
    checked = episode(spec["check_steps"], keep=True)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0
    out = Path(spec["out"])
    save_file({"actions": checked.pop("actions").contiguous()}, str(out.with_suffix(".safetensors")))
    out.write_text(json.dumps({"name": spec["name"], "runs": runs, "peak_bytes": peak,
                               "first_episode_ms": first_episode_ms, "warmup": warm, **extra}, indent=1, default=str))
    print(f"[{tag}] {spec['name']}: done, peak {peak / 2**30:.2f} GiB", flush=True)
