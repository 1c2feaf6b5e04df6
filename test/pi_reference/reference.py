"""LeRobot 0.4.4's ``PI0Policy`` / ``PI05Policy`` as a test reference, run in a process of its own.

Why a process of its own: LeRobot's π code needs transformers 4.53.2 with
openpi's changes (``transformers_shim.py``), while the test session has already
imported the project's own transformers (5.x); one process holds one
transformers. ``run_reference`` (the test side) starts
``python -m pi_reference.reference SPEC.json`` with ``.venv/pi-reference``
first on its path; for every case of the spec this module

1. builds LeRobot's policy at the case's sizes (``get_gemma_config`` and the
   PaliGemma / Gemma constructors are wrapped to give the reduced sizes: the
   published ones are fixed in LeRobot's code), perturbs every weight with seeded
   noise and writes the checkpoint with ``save_pretrained`` and its processors,
   plus the test tokenizer and ``pi_sizes.json`` (the sizes, for our loader);
2. runs ``preprocessor -> select_action -> postprocessor`` over the case's
   observations, with the noise of plan ``p`` replaced by the draw our
   counter-based stream makes for plan ``p`` (``sample_noise`` patched: LeRobot's
   ``select_action`` takes no noise), and saves the actions;
3. for a case with ``rtc``: runs LeRobot's own Real-Time Chunking bookkeeping over
   the same observations (``rtc_reference.lerobot_rtc_run``: its RTC ``ActionQueue``,
   ``predict_action_chunk`` with ``RTCConfig`` enabled, a fixed inference delay),
   plan ``p`` with our stream's noise for plan ``p``, and saves every guided chunk
   and the queue after every step beside the actions.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

#: the reduced sizes of the tests (Gemma width kept at 2048: LeRobot fixes the vision projection there)
REDUCED = {
    "paligemma": dict(width=2048, depth=2, mlp_dim=256, num_heads=8, num_kv_heads=1, head_dim=256, vocab_size=512),
    "action_expert": dict(width=256, depth=2, mlp_dim=512, num_heads=8, num_kv_heads=1, head_dim=256,
                          vocab_size=512),
    "vision": dict(hidden=96, intermediate=192, layers=2, heads=4, patch_size=14),
}
#: the published π0 / π0.5 sizes (PaliGemma 3B: So400m/14 and Gemma 2B; a Gemma 300M expert)
PUBLISHED = {
    "paligemma": dict(width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256,
                      vocab_size=257152),
    "action_expert": dict(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256,
                          vocab_size=257152),
    "vision": dict(hidden=1152, intermediate=4304, layers=27, heads=16, patch_size=14),
}


@dataclass
class Case:
    """One checkpoint and one episode to run through LeRobot."""

    directory: str
    kind: str = "pi0"                      # "pi0" or "pi05"
    cameras: int = 1
    hw: tuple[int, int] = (56, 56)
    resolution: int = 56                   # image_resolution (square); published: 224
    state: int = 5
    action: int = 4
    norm: str = "MEAN_STD"                 # STATE and ACTION normalisation
    visual_norm: str = "IDENTITY"
    cfg: dict | None = None                # PI0Config / PI05Config fields
    sizes: dict | None = None              # REDUCED (default) or PUBLISHED
    steps: int = 12
    obs_seed: int = 5
    noise_seed: int = 0
    task: str = "pick up the red cube"
    seed: int = 0
    device: str = "cpu"                    # where LeRobot runs the episode (it is built on the CPU)
    #: also LeRobot's RTC run (``rtc_run``): {"horizon", "schedule" (RTCAttentionSchedule, lower case),
    #: "max_weight", "delay" (the inference delay, control steps)}
    rtc: dict | None = None

    def features(self) -> dict:
        return dict(cameras=self.cameras, hw=tuple(self.hw), state=self.state, env=0, action=self.action)


def _install() -> None:
    from pi_reference.transformers_shim import install
    install()
    from lerobot_reference import lerobot
    lerobot()


def _reduce(modeling, sizes: dict) -> None:
    """Make LeRobot's module build the given sizes (restored by the next call)."""
    import transformers.models.gemma.modeling_gemma as gm
    import transformers.models.paligemma.modeling_paligemma as pm

    vlm, expert, vision = sizes["paligemma"], sizes["action_expert"], sizes["vision"]

    def gemma_config(variant: str):
        s = vlm if variant == "gemma_2b" else expert
        return modeling.GemmaConfig(width=s["width"], depth=s["depth"], mlp_dim=s["mlp_dim"],
                                    num_heads=s["num_heads"], num_kv_heads=s["num_kv_heads"], head_dim=s["head_dim"])

    def paligemma(config):
        config.text_config.vocab_size = config._vocab_size = vlm["vocab_size"]
        v = config.vision_config
        v.hidden_size, v.intermediate_size = vision["hidden"], vision["intermediate"]
        v.num_hidden_layers, v.num_attention_heads, v.patch_size = vision["layers"], vision["heads"], vision["patch_size"]
        return pm.PaliGemmaForConditionalGeneration(config=config)

    def gemma_expert(config):
        config.vocab_size = expert["vocab_size"]
        return gm.GemmaForCausalLM(config=config)

    modeling.get_gemma_config = gemma_config
    modeling.PaliGemmaForConditionalGeneration = paligemma
    modeling.GemmaForCausalLM = gemma_expert


def _local_tokenizer(processor_module, directory: Path) -> None:
    """LeRobot's π processors name the hub's PaliGemma tokenizer; use the local test tokenizer instead."""
    from lerobot.processor import TokenizerProcessorStep

    def step(**kwargs):
        kwargs["tokenizer_name"] = str(directory)
        return TokenizerProcessorStep(**kwargs)
    processor_module.TokenizerProcessorStep = step


def _stats(mode: str, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    from lerobot_reference import vector_stats
    if mode != "QUANTILES":
        return vector_stats(mode, n, gen)
    lo = -1 - torch.rand(n, generator=gen)
    return {"q01": lo, "q99": lo + 1 + 2 * torch.rand(n, generator=gen)}


def build_checkpoint(case: Case):
    """LeRobot's policy for ``case`` written as a checkpoint; returns (policy, config)."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot_reference import case_features, image_stats, randomize_, save_checkpoint
    from pi_reference.tokenizer import write_tokenizer

    if case.kind == "pi05":
        from lerobot.policies.pi05 import modeling_pi05 as modeling, processor_pi05 as processing
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as config_cls
        make_processors = processing.make_pi05_pre_post_processors
    else:
        from lerobot.policies.pi0 import modeling_pi0 as modeling, processor_pi0 as processing
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as config_cls
        make_processors = processing.make_pi0_pre_post_processors
    directory = Path(case.directory)
    sizes = case.sizes or REDUCED
    _reduce(modeling, sizes)
    _local_tokenizer(processing, write_tokenizer(directory / "tokenizer"))
    feats = case_features(case.features())
    inputs = {k: PolicyFeature(type=FeatureType.STATE if len(s) == 1 else FeatureType.VISUAL, shape=s)
              for k, s in feats.items()}
    mode = NormalizationMode(case.norm)
    config = config_cls(input_features=inputs,
                        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(case.action,))},
                        normalization_mapping={"VISUAL": NormalizationMode(case.visual_norm), "STATE": mode,
                                               "ACTION": mode},
                        **{"image_resolution": (case.resolution, case.resolution), "device": "cpu", **(case.cfg or {})})
    torch.manual_seed(case.seed)
    policy = modeling.PI05Policy(config) if case.kind == "pi05" else modeling.PI0Policy(config)
    saved = set(policy.state_dict())        # non-persistent buffers (RoPE frequencies) are not weights: kept
    fixed = {n: b.clone() for n, b in policy.named_buffers() if n not in saved}
    randomize_(policy, case.seed, scale=0.5)
    with torch.no_grad():
        for n, b in policy.named_buffers():
            if n in fixed:
                b.copy_(fixed[n])
    policy.eval()
    gen = torch.Generator().manual_seed(case.seed + 1)
    stats = {k: image_stats(case.visual_norm if case.visual_norm != "IDENTITY" else "MEAN_STD", gen)
             if len(s) == 3 else _stats(case.norm, s[0], gen) for k, s in feats.items()}
    stats["action"] = _stats(case.norm, case.action, gen)
    save_checkpoint(policy, config, stats, directory, make_processors)
    (directory / "pi_sizes.json").write_text(json.dumps(sizes, indent=1))
    return policy.to(case.device), config


def plan_noise(seed: int, plan: int, config) -> torch.Tensor:
    """The noise our stream draws for plan ``plan`` of an episode seeded ``seed``."""
    from flashrt_ros.ops.counter_rng import normal
    n = config.chunk_size * config.max_action_dim
    return normal(torch.tensor(seed), torch.tensor(plan), n).view(1, config.chunk_size, config.max_action_dim)


def run_episode(policy, config, case: Case) -> tuple[dict[str, torch.Tensor], list[float]]:
    """LeRobot's actions for the case's observations and the language tokens of each replanning step
    (``actions``, ``tokens``, ``token_lengths``); and the time of each replanning step."""
    from lerobot_reference import case_features, observations, processors

    pre, post = processors(config, Path(case.directory))
    obs = observations(case_features(case.features()), case.steps, seed=case.obs_seed)
    policy.reset()
    plans, replan_s, out, tokens, lengths = [0], [], [], [], []
    device = torch.device(case.device)
    if device.type == "cuda":                       # parity in fp32: no TF32 on either side
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def noise(shape, dev):
        plans[0] += 1
        return plan_noise(case.noise_seed, plans[0] - 1, config).to(dev)
    policy.model.sample_noise = noise
    with torch.no_grad():
        for o in obs:
            batch = pre({**{k: v.clone() for k, v in o.items()}, "task": case.task})
            batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            replans = len(policy._action_queue) == 0
            if replans:
                tokens.append(batch["observation.language.tokens"][0].cpu())
                lengths.append(int(batch["observation.language.attention_mask"][0].sum()))
            t0 = time.perf_counter()
            action = policy.select_action(batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if replans:
                replan_s.append(time.perf_counter() - t0)
            out.append(post(action.cpu())[0])
    return {"actions": torch.stack(out), "tokens": torch.stack(tokens),
            "token_lengths": torch.tensor(lengths)}, replan_s


def rtc_run(policy, config, case: Case) -> dict[str, torch.Tensor]:
    """LeRobot's own RTC bookkeeping (``rtc_reference.lerobot_rtc_run``) over the case's observations with
    ``case.rtc``: every guided chunk (``rtc_chunks``: plans x chunk_size x action) and the queue after each
    step (``rtc_remaining``, zero-padded, with ``rtc_remaining_len``), normalised. The policy's RTC is
    switched off again afterwards."""
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from lerobot_reference import case_features, observations, processors
    from rtc_reference import lerobot_rtc_run, padded

    rtc, device = case.rtc, torch.device(case.device)
    pre, _ = processors(config, Path(case.directory))
    obs = observations(case_features(case.features()), case.steps, seed=case.obs_seed)
    config.rtc_config = RTCConfig(enabled=True, execution_horizon=rtc["horizon"], max_guidance_weight=rtc["max_weight"],
                                  prefix_attention_schedule=RTCAttentionSchedule(rtc["schedule"].upper()))
    policy.init_rtc_processor()

    def predict(k: int, plan: int, **guidance) -> torch.Tensor:
        batch = pre({**{n: v.clone() for n, v in obs[k].items()}, "task": case.task})
        batch = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in batch.items()}
        if "prev_chunk_left_over" in guidance:
            guidance["prev_chunk_left_over"] = guidance["prev_chunk_left_over"].to(device)
        with torch.no_grad():
            chunk = policy.predict_action_chunk(batch, noise=plan_noise(case.noise_seed, plan, config).to(device),
                                                **guidance)
        return chunk[0].cpu()

    chunks, remaining = lerobot_rtc_run(predict, case.steps, rtc["delay"], config.rtc_config)
    config.rtc_config = None
    policy.init_rtc_processor()
    queues, lengths = padded(remaining, config.chunk_size)
    return {"rtc_chunks": torch.stack(chunks), "rtc_remaining": queues, "rtc_remaining_len": lengths}


def main(spec_path: str) -> None:
    from safetensors.torch import save_file

    _install()
    for raw in json.loads(Path(spec_path).read_text())["cases"]:
        case = Case(**raw)
        t0 = time.perf_counter()
        policy, config = build_checkpoint(case)
        build_s = time.perf_counter() - t0
        if case.steps == 0:                          # the checkpoint only (the benchmark times it itself)
            print(f"[pi_reference] {case.kind} {case.directory}: built in {build_s:.1f} s", flush=True)
            continue
        record, replan_s = run_episode(policy, config, case)
        if case.rtc:
            record.update(rtc_run(policy, config, case))
        save_file({k: v.contiguous() for k, v in record.items()},
                  str(Path(case.directory) / "reference_actions.safetensors"))
        (Path(case.directory) / "reference_run.json").write_text(json.dumps(
            {"case": asdict(case), "build_s": build_s, "replan_s": replan_s}, indent=1))
        print(f"[pi_reference] {case.kind} {case.directory}: built in {build_s:.1f} s, "
              f"{len(replan_s)} replans, {sum(replan_s):.2f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
