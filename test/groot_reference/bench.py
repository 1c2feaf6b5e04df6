"""LeRobot's GR00T N1.5 timed over whole episodes, in the GR00T reference process (``benchmarks/groot.py``).

``python -m groot_reference.bench SPEC.json`` (environment: ``groot_reference.reference_env``) loads a checkpoint
that ``groot_reference.reference`` wrote with LeRobot's own loaders (``reference.load_checkpoint``:
``GrootPolicy.from_pretrained`` and the saved pipelines), in the spec's precision (``use_bf16``: LeRobot's bf16
autocast over its float32 weights, set on the loaded policy as ``GrootConfig.use_bf16`` would; else float32), the
Eagle model's attention ``sdpa`` (flash-attn is not installed: ``env.no_flash_attention``), on the spec's device.
It preprocesses the spec's observations once (not timed), then runs warm-up episodes (compiled: until an
episode compiles nothing, as the π0 race) and ``episodes`` timed episodes of ``steps`` ``select_action`` calls
from a ``reset()``, each step timed up to a device synchronisation, and one more episode (``check_steps``) with
its post-processed actions kept for the benchmark's check. Every replan ``p`` is given the noise ``noise[p]`` of
the spec's ``noise`` file (our counter stream, seed 0) in place of LeRobot's one ``torch.randn`` draw
(``reference.noise_draws``), so every side of the race and the reference plan from the same noise.

``compile_model``: LeRobot's GR00T has no ``compile_model`` switch (π0's has), so this compiles what a user
would: ``torch.compile`` (``compile_mode``) of the two networks inside ``GR00TN15.get_action``, the Eagle
backbone (``_groot_model.backbone``: SigLIP, ``mlp1``, the cut Qwen3) and the DiT (``_groot_model.action_head.model``,
called once per flow step); the flow loop around them, with its noise draw, stays eager (the draw is the
replaced ``torch.randn``, which dynamo must not trace).

Writes the times, the checked actions and the peak device memory to the spec's ``out`` (JSON + safetensors).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(spec_path: str) -> None:
    from groot_reference import env                   # first: transformers 4.57, stubs, offline HF environment

    import torch
    from safetensors.torch import load_file

    from groot_reference.reference import Case, load_checkpoint, noise_draws

    spec = json.loads(Path(spec_path).read_text())
    device = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    if spec.get("no_tf32", True):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    env.no_flash_attention(spec.get("attn", "sdpa"))
    case = Case(directory=spec["directory"])
    t0 = time.perf_counter()
    policy, pre, post = load_checkpoint(case)
    use_bf16 = bool(spec.get("use_bf16", False))        # the side's precision, whatever the checkpoint says
    policy.config.use_bf16 = use_bf16                   # predict_action_chunk's autocast
    policy._groot_model.compute_dtype = "bfloat16" if use_bf16 else "float32"     # prepare_input's casts
    policy._groot_model.config.compute_dtype = policy._groot_model.compute_dtype
    policy = policy.to(device).eval()
    load_s = time.perf_counter() - t0
    model = policy._groot_model
    if spec["compile_model"]:
        model.backbone.compile(mode=spec.get("compile_mode", "default"))
        model.action_head.model.compile(mode=spec.get("compile_mode", "default"))

    raw = load_file(spec["observations"])
    obs = [{k.split("/", 1)[1]: v for k, v in raw.items() if k.startswith(f"{i}/")} for i in range(int(raw["n"]))]
    batches = []
    for o in obs:
        batch = pre({**o, "task": spec["task"]})
        batches.append({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    noise = load_file(spec["noise"])["noise"].to(device)           # (plans, 1, horizon, max_action_dim)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def episode(steps: int, keep: bool = False) -> dict:
        """``select_action`` from a ``reset()``; plan ``p`` draws ``noise[p]`` (the same in every episode)."""
        times, replans, actions, plan = [], [], [], 0
        t_start = time.perf_counter()
        with torch.no_grad():
            policy.reset()
            for i in range(steps):
                replan = len(policy._action_queue) == 0
                replans.append(replan)
                if replan and plan >= len(noise):
                    raise RuntimeError(f"plan {plan}: the noise file holds {len(noise)} plans")
                drawn: list = []
                t0 = time.perf_counter()
                with noise_draws(drawn, noise[plan] if replan else None, keep=False):
                    action = policy.select_action(dict(batches[i % len(batches)]))
                sync()
                times.append((time.perf_counter() - t0) * 1e3)
                if len(drawn) != (1 if replan else 0):
                    raise RuntimeError(f"step {i}: {len(drawn)} noise draws (replan: {replan})")
                plan += replan
                if keep:
                    actions.append(post(action)[0].float().cpu())
        out = {"episode_ms": (time.perf_counter() - t_start) * 1e3, "times": times, "replans": replans}
        if keep:
            out["actions"] = torch.stack(actions)
        return out

    from benchmarks.lerobot_side import timed_episodes
    timed_episodes(episode, spec, device, "groot_bench", load_s=load_s,
                   compiled="backbone + action_head.model" if spec["compile_model"] else None)


if __name__ == "__main__":
    main(sys.argv[1])
