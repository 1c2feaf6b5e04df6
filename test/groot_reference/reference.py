"""LeRobot 0.4.4's GR00T N1.5 (``GrootPolicy``) as a test reference, run in a process of its own.

Why a process of its own: ``lerobot.policies.groot`` needs transformers 4.57 (``env.py`` says why), while the test
session has imported the project's transformers 5.x; one process holds one transformers. ``run_reference`` (the
test side, ``__init__.py``) starts ``python -m groot_reference.reference SPEC.json`` with ``.venv/groot-reference``
first on its path. For every case of the spec this module

1. writes the stand-in of the Eagle assets repo at the case's sizes (``assets.write_assets``) into
   ``DIR/eagle2hg-processor-groot-n1p5`` and builds ``GR00TN15`` (LeRobot's class) at those sizes, seeded, every
   weight perturbed with seeded noise (so norms are not identities), saved with ``save_pretrained`` as the base
   model ``DIR/base`` (the layout of ``nvidia/GR00T-N1.5-3B``: config.json + model.safetensors);
2. builds ``GrootPolicy(GrootConfig(base_model_path=DIR/base, tokenizer_assets_repo=DIR/eagle2hg-...))``, which
   loads that base through ``GR00TN15.from_pretrained`` as a user's policy does, and writes the LeRobot
   checkpoint into ``DIR`` with ``save_pretrained`` of the policy and of ``make_groot_pre_post_processors``' pipelines
   (min-max stats of state and action, seeded);
3. runs ``preprocessor -> select_action -> postprocessor`` over ``steps`` seeded observations (uint8 images,
   float32 state, the task string), with the pipelines loaded back from ``DIR``. Before every replan
   (``select_action`` with an empty queue) it seeds torch with ``noise_seed * 100000 + plan``; LeRobot's one
   ``torch.randn((B, 16, max_action_dim))`` per replan (``flow_matching_action_head.py``) is recorded by wrapping
   ``torch.randn`` for the call (and any other draw fails the run). It writes ``reference_inputs.safetensors``,
   ``reference_actions.safetensors`` and ``reference_run.json`` (see ``__init__.py`` for the keys).

With ``"replay": true`` in the spec it instead reloads each case's checkpoint with LeRobot's own loaders
(``GrootPolicy.from_pretrained``, ``PolicyProcessorPipeline.from_pretrained``), replays the recorded inputs with the
recorded noise given back to ``torch.randn`` (no seeding), and writes ``replay_actions.safetensors`` (same keys).
"""
from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

#: the tiny test sizes (``NOTES.md`` lists the published ones beside them): 497,816 parameters
TINY = {
    "image_size": 56, "patch_size": 14,                  # Eagle tile: 16 image tokens per camera
    "vision": dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=3),
    "text": dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_hidden_layers=4, max_window_layers=4),
    "select_layer": 2,                                   # LLM layers kept
    "dit": dict(num_layers=4, num_attention_heads=2, attention_head_dim=16, output_dim=24),
    "vl_self_attention": dict(num_layers=2, num_attention_heads=2, attention_head_dim=32),   # heads*dim == LLM width
    "num_target_vision_tokens": 4, "max_state_dim": 16, "max_action_dim": 8, "action_horizon": 16,
    "num_inference_timesteps": 4, "max_seq_len": 64,
}
#: the published GR00T N1.5 3B sizes (nvidia/GR00T-N1.5-3B and its Eagle 2.5 config: SigLIP So400m/14 at 224,
#: Qwen3-1.7B cut at layer 12): 2,413,522,880 parameters with the real vocabulary (151680; the stand-in
#: tokenizer has 264)
PUBLISHED = {
    "image_size": 224, "patch_size": 14,
    "vision": dict(hidden_size=1152, intermediate_size=4304, num_attention_heads=16, num_hidden_layers=27),
    "text": dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, num_hidden_layers=28, max_window_layers=28),
    "select_layer": 12,
    "dit": dict(num_layers=16, num_attention_heads=32, attention_head_dim=48, output_dim=1024),
    "vl_self_attention": dict(num_layers=4, num_attention_heads=32, attention_head_dim=64),
    "num_target_vision_tokens": 32, "max_state_dim": 64, "max_action_dim": 32, "action_horizon": 16,
    "num_inference_timesteps": 4, "max_seq_len": 1024,
}
ASSETS_NAME = "eagle2hg-processor-groot-n1p5"
NOISE_SEED_STRIDE = 100_000


@dataclass
class Case:
    """One checkpoint and one episode to run through LeRobot's GR00T."""

    directory: str
    sizes: dict | None = None              # TINY (default) or PUBLISHED layout
    seed: int = 0                          # weights and normalisation stats
    obs_seed: int = 5                      # the episode's observations
    noise_seed: int = 0                    # replan p draws its noise after torch.manual_seed(noise_seed * 100000 + p)
    embodiment: str = "new_embodiment"     # GrootConfig.embodiment_tag (new_embodiment -> id 31)
    cameras: int = 2
    hw: tuple[int, int] = (48, 64)         # camera frames (the processor resizes them to the Eagle tile)
    state: int = 6                         # the robot's state dim (zero-padded to max_state_dim)
    action: int = 5                        # the robot's action dim (the model predicts max_action_dim)
    n_action_steps: int = 16               # the action queue's maxlen (the model's chunk is always action_horizon)
    steps: int = 20                        # select_action calls in the episode (0: the checkpoint only)
    task: str = "pick up the red cube"
    attn: str = "eager"                    # what the Eagle config's flash_attention_2 becomes: "eager" or "sdpa"
    use_bf16: bool = False                 # GrootConfig.use_bf16 (LeRobot's default True: bf16 autocast)
    constant_dims: bool = False            # state and action dim 0 with max == min in the stats
    noise_file: str | None = None          # safetensors with "noise" (P, 1, H, M): replan p is given noise[p]
                                           # instead of drawing (our counter stream into LeRobot's sampler)
    #: also an episode with Real-Time Chunking (``rtc_run``; needs ``noise_file``): {"delay", "horizon",
    #: "schedule" (RTCAttentionSchedule, lower case), "max_weight"}
    rtc: dict | None = None

    @property
    def path(self) -> Path:
        return Path(self.directory)

    def resolved_sizes(self) -> dict:
        return self.sizes or TINY


def groot_config(sizes: dict, assets_dir: Path):
    """``GR00TN15Config`` with the keys of nvidia/GR00T-N1.5-3B's config.json at ``sizes``."""
    from lerobot.policies.groot.groot_n1 import GR00TN15Config

    llm = sizes["text"]["hidden_size"]
    dit, vl = sizes["dit"], sizes["vl_self_attention"]
    backbone_cfg = dict(
        # eagle_path is ignored by LeRobot: the Eagle config is read from tokenizer_assets_repo
        eagle_path="(unused)", load_bf16=False,
        project_to_dim=None,                           # published None: eagle_linear is Identity (its Linear is 2048-in)
        reproject_vision=False, select_layer=sizes["select_layer"],
        tune_llm=False, tune_visual=True, use_flash_attention=False,
        tokenizer_assets_repo=str(assets_dir))         # absolute: HF_LEROBOT_HOME / absolute == absolute
    action_head_cfg = dict(
        action_dim=sizes["max_action_dim"], action_horizon=sizes["action_horizon"], add_pos_embed=True,
        backbone_embedding_dim=llm,
        diffusion_model_cfg=dict(
            attention_head_dim=dit["attention_head_dim"], cross_attention_dim=llm, dropout=0.2, final_dropout=True,
            interleave_self_attention=True, norm_type="ada_norm", num_attention_heads=dit["num_attention_heads"],
            num_layers=dit["num_layers"], output_dim=dit["output_dim"], positional_embeddings=None),
        hidden_size=dit["output_dim"],
        input_embedding_dim=dit["num_attention_heads"] * dit["attention_head_dim"],
        max_action_dim=sizes["max_action_dim"], max_state_dim=sizes["max_state_dim"],
        max_seq_len=sizes["max_seq_len"],
        model_dtype="float32", noise_beta_alpha=1.5, noise_beta_beta=1.0, noise_s=0.999,
        num_inference_timesteps=sizes["num_inference_timesteps"],
        num_target_vision_tokens=sizes["num_target_vision_tokens"],
        num_timestep_buckets=1000, tune_diffusion_model=True, tune_projector=True, use_vlln=True,
        vl_self_attention_cfg=dict(attention_head_dim=vl["attention_head_dim"], dropout=0.2, final_dropout=True,
                                   num_attention_heads=vl["num_attention_heads"], num_layers=vl["num_layers"],
                                   positional_embeddings=None),
    )
    return GR00TN15Config(backbone_cfg=backbone_cfg, action_head_cfg=action_head_cfg,
                          action_horizon=sizes["action_horizon"], action_dim=sizes["max_action_dim"],
                          compute_dtype="float32", model_type="gr00t_n1_5", architectures=["GR00T_N1_5"])


def perturb_(module: torch.nn.Module, seed: int, scale: float = 0.1) -> None:
    """Add seeded noise to every parameter (the initialisation leaves norms at weight 1 / bias 0 and biases at 0,
    under which a port that swapped a scale and a shift would still agree)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2 and p.numel() > 1:
                p.add_(scale * noise * p.std().clamp_min(1e-3))
            else:
                p.add_(scale * noise)


def stats(case: Case) -> dict[str, dict[str, torch.Tensor]]:
    """The dataset stats the processors normalise with (min-max, to [-1, 1]), seeded by ``case.seed``."""
    gen = torch.Generator().manual_seed(case.seed + 1)
    out = {"observation.state": {"min": -2 - torch.rand(case.state, generator=gen),
                                 "max": 2 + torch.rand(case.state, generator=gen)},
           "action": {"min": -1 - torch.rand(case.action, generator=gen),
                      "max": 1 + torch.rand(case.action, generator=gen)}}
    if case.constant_dims:
        for s in out.values():
            s["max"][0] = s["min"][0]
    return out


def observations(case: Case) -> dict[str, torch.Tensor]:
    """The episode's inputs, stacked over steps: ``observation.images.cam{i}`` uint8 (steps, 3, H, W) and
    ``observation.state`` float32 (steps, state), varying smoothly so that every replan sees new ones."""
    gen = torch.Generator().manual_seed(case.obs_seed)
    i = torch.arange(case.steps, dtype=torch.float32)
    out = {}
    for c in range(case.cameras):
        base, drift = torch.rand(3, *case.hw, generator=gen), torch.randn(3, *case.hw, generator=gen)
        x = (base + 0.05 * i.view(-1, 1, 1, 1) * drift).remainder(1.0)
        out[f"observation.images.cam{c}"] = (x * 255).round().clamp(0, 255).to(torch.uint8)
    base, drift = torch.randn(case.state, generator=gen), torch.randn(case.state, generator=gen)
    out["observation.state"] = (base + 0.1 * i.view(-1, 1) * drift).contiguous()
    return out


def make_config(case: Case):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.groot.configuration_groot import GrootConfig

    sizes, d = case.resolved_sizes(), case.path
    return GrootConfig(
        input_features={**{f"observation.images.cam{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, *case.hw))
                           for c in range(case.cameras)},
                        "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(case.state,))},
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(case.action,))},
        base_model_path=str(d / "base"), tokenizer_assets_repo=str(d / ASSETS_NAME),
        image_size=(sizes["image_size"], sizes["image_size"]),
        max_state_dim=sizes["max_state_dim"], max_action_dim=sizes["max_action_dim"],
        chunk_size=max(sizes["action_horizon"], case.n_action_steps), n_action_steps=case.n_action_steps,
        embodiment_tag=case.embodiment, use_bf16=case.use_bf16, device="cpu", tune_visual=False, tune_llm=False)


def build_checkpoint(case: Case):
    """Base model, policy and LeRobot checkpoint for ``case`` (module docstring, steps 1-2); returns (policy, info)."""
    from lerobot.policies.groot.groot_n1 import GR00TN15
    from lerobot.policies.groot.modeling_groot import GrootPolicy
    from lerobot.policies.groot.processor_groot import make_groot_pre_post_processors

    from groot_reference.assets import write_assets

    sizes, d = case.resolved_sizes(), case.path
    d.mkdir(parents=True, exist_ok=True)
    info = write_assets(d / ASSETS_NAME, sizes)
    torch.manual_seed(case.seed)
    base = GR00TN15(groot_config(sizes, d / ASSETS_NAME), local_model_path=str(d / "base"))
    perturb_(base, case.seed)
    base.save_pretrained(str(d / "base"), safe_serialization=True)
    del base
    config = make_config(case)
    policy = GrootPolicy(config).eval()             # -> GR00TN15.from_pretrained(DIR/base)
    policy.save_pretrained(d)
    pre, post = make_groot_pre_post_processors(config, dataset_stats=stats(case))
    pre.save_pretrained(d)
    post.save_pretrained(d)
    info["parameters"] = sum(p.numel() for p in policy.parameters())
    (d / "groot_sizes.json").write_text(json.dumps({"sizes": sizes, **info}, indent=1))
    return policy, info


def load_checkpoint(case: Case):
    """The checkpoint in ``case.directory`` loaded back by LeRobot: (policy, preprocessor, postprocessor)."""
    from lerobot.policies.groot.modeling_groot import GrootPolicy

    policy = GrootPolicy.from_pretrained(case.path).eval()
    return (policy, *load_checkpoint_processors(case))


@contextmanager
def noise_draws(drawn: list[torch.Tensor], replay: torch.Tensor | None = None, keep: bool = True):
    """Record every ``torch.randn`` LeRobot makes inside the block; with ``replay``, return it instead of drawing.
    ``keep=False``: record a placeholder (``None``) per draw instead of a host copy (a timed step on a GPU must
    not read the device: ``groot_reference.bench``)."""
    real = torch.randn

    def randn(*args, **kwargs):
        if replay is None:
            out = real(*args, **kwargs)
        else:
            size = kwargs.get("size", args[0] if len(args) == 1 and not isinstance(args[0], int) else args)
            if tuple(size) != tuple(replay.shape):
                raise AssertionError(f"noise of shape {tuple(size)} drawn, {tuple(replay.shape)} recorded")
            out = replay.to(dtype=kwargs.get("dtype") or torch.get_default_dtype(),
                            device=kwargs.get("device") or "cpu").clone()
        drawn.append(out.detach().cpu().clone() if keep else None)
        return out

    torch.randn = randn
    try:
        yield
    finally:
        torch.randn = real


def run_episode(case: Case, policy, pre, post, inputs: dict[str, torch.Tensor],
                noise: torch.Tensor | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``pre -> select_action -> post`` over ``inputs``; each replan seeded (or given ``noise[plan]``). Returns the
    record (``__init__.reference_record``'s keys) and the seconds of each replanning step."""
    model = policy._groot_model
    taps: dict[str, torch.Tensor] = {}
    hook = model.backbone.register_forward_hook(
        lambda m, i, o: taps.__setitem__("backbone_features", o["backbone_features"].detach().clone()))
    get_action = model.get_action

    def tapped_get_action(*args, **kwargs):
        out = get_action(*args, **kwargs)
        taps["action_pred"] = out["action_pred"].detach().float().clone()
        return out
    model.get_action = tapped_get_action
    pre_keys = ("eagle_input_ids", "eagle_attention_mask", "eagle_pixel_values", "state", "embodiment_id")
    rec: dict[str, list] = {k: [] for k in ("actions", "actions_normalized", "plan_steps", "noise", "action_pred",
                                            "backbone_features", *pre_keys)}
    replan_s = []
    policy.reset()
    try:
        with torch.no_grad():
            for step in range(case.steps):
                obs = {k: v[step].clone() for k, v in inputs.items()}
                batch = pre({**obs, "task": case.task})
                replans = len(policy._action_queue) == 0
                plan = len(rec["plan_steps"])
                if replans and noise is None:
                    torch.manual_seed(case.noise_seed * NOISE_SEED_STRIDE + plan)
                drawn: list[torch.Tensor] = []
                t0 = time.perf_counter()
                with noise_draws(drawn, noise[plan] if replans and noise is not None else None):
                    action = policy.select_action(batch)
                elapsed = time.perf_counter() - t0
                if len(drawn) != (1 if replans else 0):
                    raise AssertionError(f"step {step}: {len(drawn)} torch.randn draws (replan: {replans})")
                if replans:
                    replan_s.append(elapsed)
                    rec["plan_steps"].append(step)
                    rec["noise"].append(drawn[0])
                    for k in ("action_pred", "backbone_features"):
                        rec[k].append(taps.pop(k))
                    for k in pre_keys:
                        rec[k].append(batch[k].detach().cpu().clone())
                rec["actions_normalized"].append(action[0].float().cpu().clone())
                rec["actions"].append(post(action)[0].float().cpu().clone())
    finally:
        hook.remove()
        del model.get_action
    out = {k: torch.stack(v) for k, v in rec.items() if k != "plan_steps"}
    out["plan_steps"] = torch.tensor(rec["plan_steps"], dtype=torch.int64)
    return out, replan_s


def rtc_run(case: Case, policy, pre, inputs: dict[str, torch.Tensor], noise: torch.Tensor) -> dict[str, torch.Tensor]:
    """LeRobot's own RTC bookkeeping (``rtc_reference.lerobot_rtc_run``: its RTC ``ActionQueue``) over the episode's
    inputs with ``case.rtc``, plan p given ``noise[p]``: every guided chunk (``rtc_chunks``: plans x horizon x
    action, normalised) and the queue after each step (``rtc_remaining``, zero-padded, ``rtc_remaining_len``).

    LeRobot's GR00T has no RTC, so its ``get_action`` loop is guided from outside, unchanged otherwise: a hook on
    the action encoder keeps each flow step's noisy actions ``x_t``, and a hook on the action decoder replaces the
    velocity rows by what LeRobot's ``RTCProcessor.denoise_step`` makes of them. That processor is written for π's
    flow (noise at time 1, falling), GR00T's rises from noise at ``t = 0``: it is called at time ``1 - t`` with
    velocity ``-v`` and its answer negated (``t = step / N``, LeRobot's ``t_cont``)."""
    from lerobot.configs.types import RTCAttentionSchedule
    from lerobot.policies.rtc.configuration_rtc import RTCConfig
    from lerobot.policies.rtc.modeling_rtc import RTCProcessor
    from rtc_reference import lerobot_rtc_run, padded

    rtc = case.rtc
    config = RTCConfig(enabled=True, execution_horizon=rtc["horizon"], max_guidance_weight=rtc["max_weight"],
                       prefix_attention_schedule=RTCAttentionSchedule(rtc["schedule"].upper()))
    processor = RTCProcessor(config)
    head = policy._groot_model.action_head
    horizon, steps = head.config.action_horizon, head.num_inference_timesteps
    flow: dict = {"guidance": None, "x": [], "step": 0}

    def keep_x(_module, args):
        flow["x"].append(args[0])

    def guide_v(_module, _args, pred):
        step, x_t = flow["step"], flow["x"][-1]
        flow["step"] += 1
        if flow["guidance"] is None:
            return None
        v = pred[:, -horizon:]
        guided = -processor.denoise_step(x_t, original_denoise_step_partial=lambda _x: -v,
                                         time=1 - step / float(steps), **flow["guidance"])
        return torch.cat((pred[:, :-horizon], guided.to(pred.dtype)), dim=1)

    hooks = [head.action_encoder.register_forward_pre_hook(keep_x),
             head.action_decoder.register_forward_hook(guide_v)]

    def predict(k: int, plan: int, **guidance) -> torch.Tensor:
        flow.update(guidance=guidance or None, x=[], step=0)
        batch = pre({**{n: v[k].clone() for n, v in inputs.items()}, "task": case.task})
        with torch.no_grad(), noise_draws([], noise[plan]):
            chunk = policy.predict_action_chunk(batch)
        if flow["step"] != steps:
            raise AssertionError(f"{flow['step']} flow steps seen, {steps} expected")
        return chunk[0].float().cpu()

    try:
        chunks, remaining = lerobot_rtc_run(predict, case.steps, rtc["delay"], config)
    finally:
        for hook in hooks:
            hook.remove()
    queues, lengths = padded(remaining, horizon)
    return {"rtc_chunks": torch.stack(chunks), "rtc_remaining": queues, "rtc_remaining_len": lengths}


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def reference(case: Case) -> None:
    t0 = time.perf_counter()
    policy, info = build_checkpoint(case)
    build_s = time.perf_counter() - t0
    if case.steps == 0:                              # the checkpoint only (benchmarks/groot.py --build)
        (case.path / "reference_run.json").write_text(json.dumps(
            {"case": asdict(case), "build_s": build_s, "replan_s": [], **info}, indent=1))
        print(f"[groot_reference] {case.directory}: {info['parameters']:,} parameters, built in {build_s:.1f} s "
              f"(no episode)", flush=True)
        return
    pre, post = load_checkpoint_processors(case)     # the episode runs the pipelines as saved
    inputs = observations(case)
    st = stats(case)
    _save({**inputs, **{f"stats.{k}.{s}": v for k, d in st.items() for s, v in d.items()}},
          case.path / "reference_inputs.safetensors")
    given = None
    if case.noise_file:
        from safetensors.torch import load_file
        given = load_file(case.noise_file)["noise"]
    record, replan_s = run_episode(case, policy, pre, post, inputs, noise=given)
    if case.rtc:
        record.update(rtc_run(case, policy, pre, inputs, given))
    _save(record, case.path / "reference_actions.safetensors")
    import lerobot
    import transformers
    (case.path / "reference_run.json").write_text(json.dumps(
        {"case": asdict(case), "build_s": build_s, "replan_s": replan_s, "torch_threads": torch.get_num_threads(),
         "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                      "lerobot": getattr(lerobot, "__version__", "?")}, **info}, indent=1))
    print(f"[groot_reference] {case.directory}: {info['parameters']:,} parameters, built in {build_s:.1f} s, "
          f"{len(replan_s)} replans, {sum(replan_s):.2f} s", flush=True)


def load_checkpoint_processors(case: Case):
    """The checkpoint's pre/post-processor pipelines as LeRobot loads them. The Eagle encode and collate steps
    save no configuration (LeRobot 0.4.4's ``get_config`` of neither returns ``tokenizer_assets_repo``), so a
    reloaded pipeline would look for the hub repo's default name under ``HF_LEROBOT_HOME``: the assets
    directory beside the checkpoint is given back as an override, as a user with other assets would."""
    from lerobot.processor import PolicyProcessorPipeline
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    assets = {"tokenizer_assets_repo": str(case.path / ASSETS_NAME)}
    pre = PolicyProcessorPipeline.from_pretrained(
        case.path, config_filename="policy_preprocessor.json",
        overrides={"groot_eagle_encode_v3": assets, "groot_eagle_collate_v3": assets})
    post = PolicyProcessorPipeline.from_pretrained(
        case.path, config_filename="policy_postprocessor.json",
        to_transition=policy_action_to_transition, to_output=transition_to_policy_action)
    return pre, post


def replay(case: Case) -> None:
    from safetensors.torch import load_file

    policy, pre, post = load_checkpoint(case)
    saved = load_file(str(case.path / "reference_inputs.safetensors"))
    inputs = {k: v for k, v in saved.items() if not k.startswith("stats.")}
    noise = load_file(str(case.path / "reference_actions.safetensors"))["noise"]
    record, replan_s = run_episode(case, policy, pre, post, inputs, noise=noise)
    _save(record, case.path / "replay_actions.safetensors")
    print(f"[groot_reference] {case.directory}: replayed from the checkpoint, {len(replan_s)} replans", flush=True)


def main(spec_path: str) -> None:
    from groot_reference import env                   # first: transformers 4.57, stubs, offline HF environment

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(int(spec.get("threads", 1)))
    for raw in spec["cases"]:
        case = Case(**{**raw, "hw": tuple(raw.get("hw", Case.hw))})
        env.no_flash_attention(case.attn)
        replay(case) if spec.get("replay") else reference(case)


if __name__ == "__main__":
    main(sys.argv[1])
