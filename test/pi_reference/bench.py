"""LeRobot's π0 / π0.5 timed over whole episodes, in the reference process (``benchmarks/pi0.py``).

``python -m pi_reference.bench SPEC.json`` loads a checkpoint that
``pi_reference.reference`` wrote into LeRobot's policy with the spec's ``dtype``
(LeRobot's own precision switch) and ``compile_model`` (its ``torch.compile`` of
``sample_actions``), preprocesses the spec's observations (not timed), then runs
warm-up episodes (a compiled policy: until an episode compiles nothing, as in the
race) and ``episodes`` timed episodes of ``steps`` steps from a ``reset()``, each
step timed up to a synchronisation, and one more episode with its post-processed
actions kept, for the benchmark to compare with ours. Every episode runs
``select_action``'s queue logic with the noise of our counter stream (seed 0)
passed to ``predict_action_chunk``, so the noise is drawn outside the compiled
``sample_actions``. ``widen_to_float32``: the policy is loaded in the spec's dtype
(LeRobot's cast) and then run in float32 (the bf16-weights reference): the parameters as the cast rounded them,
the RoPE frequencies exact (``exact_rope``). Writes the times, the actions and the peak
device memory to the spec's ``out`` file (JSON + safetensors).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def load_policy(directory: Path, kind: str, dtype: str, compile_model: bool, compile_mode: str, device: str):
    """LeRobot's policy for the checkpoint: built at its sizes, weights loaded (the tied language head too)."""
    from lerobot.configs.policies import PreTrainedConfig
    from safetensors.torch import load_file

    from pi_reference.reference import _reduce
    if kind == "pi05":
        from lerobot.policies.pi05 import modeling_pi05 as modeling
    else:
        from lerobot.policies.pi0 import modeling_pi0 as modeling
    _reduce(modeling, json.loads((directory / "pi_sizes.json").read_text()))
    config = PreTrainedConfig.from_pretrained(str(directory))
    config.dtype, config.compile_model, config.compile_mode, config.device = dtype, compile_model, compile_mode, "cpu"
    policy = (modeling.PI05Policy if kind == "pi05" else modeling.PI0Policy)(config)
    weights = load_file(str(directory / "model.safetensors"))
    missing, unexpected = policy.load_state_dict(weights, strict=False)
    tied = "model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    if unexpected or set(missing) - {tied}:
        raise RuntimeError(f"checkpoint does not match: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return policy.to(device).eval(), config


def exact_rope(policy: torch.nn.Module) -> None:
    """Give every rotary embedding back its float32 frequencies. LeRobot's bf16 cast (``module.to(bfloat16)``)
    also rounds the ``inv_freq`` buffers (1 / 10000^(i/d): 0.9306 becomes 0.9297), which at the published
    prefix (about 560 positions) turns each angle by up to half a radian; widening does not undo that. They are
    not weights: our bf16 keeps them exact, and the reference of bf16 sides computes with the rounded
    parameters and exact frequencies (LeRobot's own bf16 sides then show their rounding as error: the race
    on an H100 of 2026-12-07, 6350a6f, had ours 8.5e-2 from the rounded-frequency reference, 2.2e-2 from
    float32, LeRobot compiled 1.2e-2 / 8.2e-2). transformers keeps the float32 originals in
    ``original_inv_freq``, a plain attribute the cast does not touch."""
    for module in policy.modules():
        original = getattr(module, "original_inv_freq", None)
        if original is not None and hasattr(module, "inv_freq"):
            module.inv_freq = original.to(device=module.inv_freq.device, dtype=torch.float32)


def main(spec_path: str) -> None:
    from safetensors.torch import load_file

    from lerobot_reference import processors
    from pi_reference.reference import _install, plan_noise
    _install()
    spec = json.loads(Path(spec_path).read_text())
    directory, device = Path(spec["directory"]), torch.device(spec["device"])
    if spec.get("no_tf32", True):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    policy, config = load_policy(directory, spec["kind"], spec["dtype"], spec["compile_model"],
                                 spec.get("compile_mode", "max-autotune"), spec["device"])
    if spec.get("widen_to_float32"):
        # the weights a bf16 side computes with (LeRobot's own bf16 cast), in float32 arithmetic: the reference
        # of bf16 sides (benchmarks/action_checks.py)
        policy.to(torch.float32)
        exact_rope(policy)
        config.dtype = "float32"
    pre, post = processors(config, directory)
    raw = load_file(spec["observations"])
    n_obs = int(raw["n"])
    obs = [{k.split("/", 1)[1]: v for k, v in raw.items() if k.startswith(f"{i}/")} for i in range(n_obs)]
    batches = []
    for o in obs:
        batch = pre({**o, "task": spec["task"]})
        batches.append({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    n = config.n_action_steps
    noises = [plan_noise(0, p, config).to(device) for p in range(-(-max(spec["steps"], spec["check_steps"]) // n))]

    def episode(steps: int, keep: bool = False) -> dict:
        """``select_action``'s own queue logic around ``predict_action_chunk``, with plan ``p``'s noise from our
        counter stream (seed 0) passed in: drawn outside the (compiled) ``sample_actions``, whose dynamo graph
        cannot trace the host-side hash, and the same in every episode, timed or checked."""
        times, replans, actions, queue, plan = [], [], [], [], 0
        t_start = time.perf_counter()
        with torch.no_grad():
            policy.reset()
            for i in range(steps):
                replans.append(not queue)
                t0 = time.perf_counter()
                if not queue:
                    chunk = policy.predict_action_chunk(dict(batches[i % len(batches)]), noise=noises[plan])
                    queue, plan = list(chunk[:, :n].transpose(0, 1)), plan + 1
                action = queue.pop(0)
                sync()
                times.append((time.perf_counter() - t0) * 1e3)
                if keep:
                    actions.append(post(action.float().cpu())[0])
        out = {"episode_ms": (time.perf_counter() - t_start) * 1e3, "times": times, "replans": replans}
        if keep:
            out["actions"] = torch.stack(actions)
        return out

    from benchmarks.lerobot_side import timed_episodes
    timed_episodes(episode, spec, device, "pi_bench")


if __name__ == "__main__":
    main(sys.argv[1])
