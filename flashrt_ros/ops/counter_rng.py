"""The one counter-based random number generator: LLM sampling and every policy's noise.

Why counter-based: the generator's whole state is ``(seed, counter)``, two
int64 scalars in the arena, so a capsule restores the random stream exactly,
and every draw is a pure function of tensors (capturable as a CUDA graph, no
``torch.Generator`` object, never torch's global RNG).

Why these constants: values are kept in ``[0, 2**32)`` and both multipliers are
odd and below ``2**31``, so no product reaches ``2**63``: int64 never overflows
on any backend, and each multiply is a bijection mod ``2**32``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
MUL1, MUL2 = 0x21F0AAAD, 0x735A2D97
_SALT = 0x2545F491                      # separates the four input words before mixing


def hash32(x: Tensor) -> Tensor:
    """A bijective 32-bit avalanche mix (xorshift-multiply rounds) on int64 tensors."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = (x * MUL1) & MASK32
    x = x ^ (x >> 15)
    x = (x * MUL2) & MASK32
    return x ^ (x >> 15)


def uniform_bits(seed: Tensor, counter: Tensor, index: Tensor) -> Tensor:
    """32 random bits per ``index``, a pure function of (seed, counter, index).

    The four 32-bit words of (seed, counter) are mixed in parallel (one hash
    over four lanes, each salted by its lane) and folded into one key; the
    index is then hashed under that key. Fewer dependent ops than a chain.
    """
    words = torch.stack([seed >> 32, seed, counter >> 32, counter]) & MASK32
    lanes = torch.arange(1, 5, device=seed.device, dtype=torch.int64)
    mixed = hash32(words ^ ((lanes * _SALT) & MASK32))
    key = mixed[0] ^ mixed[1] ^ mixed[2] ^ mixed[3]
    return hash32(hash32(index) ^ key)


def uniform(seed: Tensor, counter: Tensor, index: Tensor) -> Tensor:
    """Float32 numbers in the open interval (0, 1), one per ``index``, for draw ``counter``."""
    # the top 24 bits are exact in float32; +0.5 keeps u strictly inside (0, 1)
    return ((uniform_bits(seed, counter, index) >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def normal(seed: Tensor, counter: Tensor, n: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """``n`` standard-normal samples for draw number ``counter`` (Box-Muller over 2n uniforms)."""
    u = uniform(seed, counter, torch.arange(2 * n, device=seed.device, dtype=torch.int64))
    u1, u2 = u[:n], u[n:]
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return z.to(dtype)
