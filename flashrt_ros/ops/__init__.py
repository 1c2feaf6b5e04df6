"""Pure-torch reference ops for the hybrid decoder, with CUDA fast paths where a kernel exists.

Why a separate package: the model code states *what* a layer computes; these
functions state *how*, once, so the CPU reference path and the flash-linear-
attention path are chosen in one place and the parity tests cover both.
"""
from flashrt_ros.ops.causal_conv import causal_conv1d_with_state
from flashrt_ros.ops.gated_delta import (
    chunk_gated_delta_rule,
    fla_available,
    recurrent_gated_delta_step,
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)
from flashrt_ros.ops.norms import gated_rms_norm, l2_normalize, offset_rms_norm
from flashrt_ros.ops.rope import apply_partial_rope, rope_cos_sin, rope_inv_freq

__all__ = [
    "apply_partial_rope",
    "causal_conv1d_with_state",
    "chunk_gated_delta_rule",
    "fla_available",
    "gated_rms_norm",
    "l2_normalize",
    "offset_rms_norm",
    "recurrent_gated_delta_step",
    "rope_cos_sin",
    "rope_inv_freq",
    "torch_chunk_gated_delta_rule",
    "torch_recurrent_gated_delta_rule",
]
