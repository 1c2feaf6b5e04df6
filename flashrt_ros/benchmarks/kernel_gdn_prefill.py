"""fla's chunked Gated DeltaNet forward on a short turn: which fla chunk size is cheapest.

A follow-up turn of T = 64 tokens is one fla chunk of 64: every kernel of the
chunked form then runs one program per head (16 for the hybrid), so the
layer is bound by latency, not bytes. Smaller chunks give more programs per
kernel and smaller triangular solves, but a longer sequential state pass.
Prints the time of one layer's ``chunk_gated_delta_rule`` (hybrid shape:
16 key / 16 value heads of 128, bf16, float32 state and decay) for T in
(16, 64, 256) and fla chunk sizes 16 / 32 / 64, in a CUDA graph, and the
largest output difference against chunk 64. Run on a GPU:
``python -m flashrt_ros.benchmarks.kernel_gdn_prefill``.
"""
from __future__ import annotations

import torch

from flashrt_ros.benchmarks.timing import graph_ms

HEADS, DK, DV = 16, 128, 128


def main() -> None:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (16, 64, 256):
        q = torch.randn(1, t, HEADS, DK, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, t, HEADS, DK, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, t, HEADS, DV, device="cuda", dtype=torch.bfloat16, generator=gen)
        g = -torch.rand(1, t, HEADS, device="cuda", generator=gen) * 0.5
        beta = torch.rand(1, t, HEADS, device="cuda", generator=gen).to(torch.bfloat16)
        h0 = torch.randn(1, HEADS, DK, DV, device="cuda", generator=gen) * 0.1
        outs = {}
        for chunk in (64, 32, 16):
            def run(c: int = chunk) -> tuple[torch.Tensor, torch.Tensor]:
                return chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0,
                                              output_final_state=True, use_qk_l2norm_in_kernel=True,
                                              chunk_size=c)
            outs[chunk] = run()
            ms = graph_ms(run)
            diff = (outs[chunk][0].float() - outs[64][0].float()).abs().max().item()
            print(f"T={t} fla chunk {chunk}: {ms * 1e3:.1f} us per layer, max |out - chunk 64| {diff:.2e}")


if __name__ == "__main__":
    main()
