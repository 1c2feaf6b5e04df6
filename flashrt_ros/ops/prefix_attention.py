"""Attention over one key head: a valid prefix, then the action rows with π0's state-token rule.

The VLA's two attentions in one function: the prefix (queries are the prefix rows,
keys its valid rows: bidirectional) and the expert (queries are the action rows,
keys the valid prefix rows and the suffix rows, where a query sees a suffix key when
the key is one of the first ``state_rows`` or the query is past them: π0's state
token sees only itself, the actions see it and each other; π0.5 has none). The
torch expression here is the reference (SDPA under the explicit mask, the query
heads folded into rows); CUDA tensors take one triton kernel
(``ops.triton.prefix_attention``) that derives the mask from the key index.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from flashrt_ros.ops.triton import use_triton


def visible_keys(n_queries: int, n_keys: int, valid: torch.Tensor, suffix_start: int, suffix_len: int,
                 state_rows: int) -> torch.Tensor:
    """``(n_queries, n_keys)`` booleans: which key each query sees (see the module doc)."""
    dev = valid.device
    j = torch.arange(n_keys, device=dev)
    i = j - suffix_start
    prefix = (j < valid) & (j < suffix_start)
    suffix = (j >= suffix_start) & (i < suffix_len)
    query = torch.arange(n_queries, device=dev)
    return prefix[None, :] | (suffix[None, :] & ((i[None, :] < state_rows) | (query[:, None] >= state_rows)))


def prefix_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, *,
                     suffix_start: int, suffix_len: int = 0, state_rows: int = 0) -> torch.Tensor:
    """``q (L, H, D)`` over ``keys, values (S, 1, D)``: prefix rows ``[0, valid)`` (``valid`` a 0-d device
    tensor, at most ``suffix_start``) and suffix rows ``[suffix_start, suffix_start + suffix_len)``.
    Returns ``(L, H * D)``; every query must see a key (``valid >= 1``)."""
    if use_triton(q):
        from flashrt_ros.ops.triton.prefix_attention import prefix_attention as fused
        return fused(q, keys, values, valid, suffix_start, suffix_len, state_rows)
    L, H, D = q.shape
    S = keys.shape[0]
    seen = visible_keys(L, S, valid, suffix_start, suffix_len, state_rows).repeat_interleave(H, dim=0)
    out = F.scaled_dot_product_attention(q.reshape(1, 1, L * H, D), keys.view(1, 1, S, D), values.view(1, 1, S, D),
                                         attn_mask=seen[None, None])
    return out.view(L, H * D)
