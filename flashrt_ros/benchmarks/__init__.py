"""Every benchmark of the project, in one package (run each as ``python -m flashrt_ros.benchmarks.<name>``).

Commands:
- ``llm`` (console script ``flashrt-bench``): the follow-up turn from a capsule vs a
  cold prefill, re-entry, decode and capsule verbs, ours vs transformers;
  writes ``docs/benchmarks/llm.md``.
- ``capsules``: capsule verbs alone on synthetic arenas (device / host / disk tiers).
- ``ros_latency``: capsule service round trips through DDS (node in a subprocess).
- ``control_loop``: the policy engine's control loop at a fixed rate.
- ``sessions``: a session switch (park the live state, restore another) vs a flat copy.
- ``kernel_gemv``, ``kernel_attention``, ``kernel_segment_copies``,
  ``kernel_decode_overhead``: micro-benchmarks of single kernels (GPU; ``gpu_args`` gives them
  ``--help`` and a clear refusal without CUDA).
- ``run_gpu_suite.sh``: the GPU tests, ``capsules`` and ``llm`` in one go.

Helpers of ``llm``: ``timing`` (timers, copy floor), ``models`` (model pairs),
``measure`` (one model at one context), ``anatomy`` (profiler breakdown),
``budget`` (time guard), ``report`` (markdown and plot).
"""
