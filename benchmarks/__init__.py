"""Every benchmark of the project, in one package beside (not inside) the library.

Why outside ``flashrt_ros``: a robot installs the runtime, not its measurements,
so neither the wheel nor the colcon install holds this folder. Run each from a checkout (the repository
root, with ``flashrt_ros`` importable: ``scripts/setup.sh`` or a sourced colcon
workspace) as ``python -m benchmarks.<name>``.

Commands:
- ``llm``: the follow-up turn from a capsule vs a
  cold prefill, re-entry, decode and capsule verbs, ours vs transformers;
  writes ``docs/benchmarks/llm.md``.
- ``capsules``: capsule verbs alone on synthetic arenas (device / host / disk tiers).
- ``ros_latency``: capsule service round trips through DDS (node in a subprocess).
- ``control_loop``: the policy engine's control loop at a fixed rate.
- ``sessions``: a session switch (park the live state, restore another) vs a flat copy.
- ``kernel_gemv``, ``kernel_attention``, ``kernel_segment_copies``,
  ``kernel_decode_overhead``: micro-benchmarks of single kernels (GPU; ``gpu_args`` gives them
  ``--help`` and a clear refusal without CUDA).
- ``policies`` / ``smolvla``: the race against LeRobot (eager, compiled, autocast / bf16 weights), same
  inputs and noise, outputs checked in the run; helpers ``race`` (one precision of one policy),
  ``race_report`` (its markdown page), ``lerobot_side`` (LeRobot's modes, built and stepped as ``lerobot_eval`` does), ``spread``
  (min / median / max, bootstrap interval, steps over a period).
- ``run_gpu_suite.sh``: the GPU tests, ``capsules``, ``llm`` and the races in one go.

``provenance`` puts the commit, package versions, machine and flags into every JSON a benchmark writes.

Helpers of ``llm``: ``timing`` (timers, copy floor), ``models`` (model pairs),
``measure`` (one model at one context), ``anatomy`` (profiler breakdown),
``budget`` (time guard), ``report`` (markdown and plot).
"""
