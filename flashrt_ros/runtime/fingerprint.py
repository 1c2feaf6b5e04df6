"""The fingerprint: what must match for a capsule's bytes to mean the same thing again.

A capsule is only meaningful to the exact model that wrote it: same config,
same weights, same dtypes, same arena layout, same code (kernels change
numerics and state layouts). The fingerprint hashes all of them; the store
refuses capsules whose fingerprint differs (``FingerprintMismatch``).

Weights: if all weights together are at most ``FULL_HASH_LIMIT`` bytes, every
byte is hashed. Above that, hashing every byte on every start would be slow on
the host, so each tensor contributes (a) its name, shape and dtype, (b) an
exact int64 sum of its bytes (computed where the tensor lives, so on a GPU it
is one fast reduction; it changes under any single-bit flip), and (c) the
blake2b of ``SAMPLE_CHUNKS`` chunks of ``SAMPLE_CHUNK_BYTES`` bytes at evenly
spaced offsets (first and last chunk included). That distinguishes different
checkpoints and fine-tunes with near certainty, but two different edits that
leave the byte sum equal and touch no sampled chunk would collide: it is an
identity check, not a tamper seal. Library and kernel versions are not added
implicitly; pass them in ``extra`` (or in ``code_version``).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping

import torch

from flashrt_ros.runtime.arena import StateArena

FULL_HASH_LIMIT = 256 * 1024 * 1024
SAMPLE_CHUNKS = 64
SAMPLE_CHUNK_BYTES = 4096
FINGERPRINT_PREFIX = "frt1-"


def canonical_json(obj: Any) -> str:
    """Key-sorted, whitespace-free JSON; non-JSON values (dtypes, paths) via ``str``."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=True)


def _raw_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


SUM_CHUNK_BYTES = 64 * 1024 * 1024


def byte_sum(raw: torch.Tensor) -> int:
    """The exact sum of ``raw``'s bytes, taken in bounded chunks, so whatever a reduction to int64 stages on the
    device stays small beside a 1 GiB tensor (π0's embedding); the value is the whole sum, as before."""
    return sum(int(raw[i:i + SUM_CHUNK_BYTES].sum(dtype=torch.int64).item())
               for i in range(0, raw.numel(), SUM_CHUNK_BYTES))


def _sampled_digest(raw: torch.Tensor) -> str:
    n = raw.numel()
    h = hashlib.blake2b(digest_size=16)
    h.update(str(byte_sum(raw)).encode())
    chunk = min(SAMPLE_CHUNK_BYTES, n)
    if chunk:
        count = min(SAMPLE_CHUNKS, max(1, n // chunk))
        span = n - chunk
        starts = sorted({(span * i) // max(1, count - 1) for i in range(count)})
        idx = torch.tensor(starts, device=raw.device).unsqueeze(1) + torch.arange(chunk, device=raw.device)
        h.update(raw[idx.reshape(-1)].cpu().numpy().data)
    return h.hexdigest()


def weights_digest(named_weights: Iterable[tuple[str, torch.Tensor]]) -> str:
    """Stable digest of weights, order-independent (sorted by name)."""
    items = sorted(named_weights, key=lambda kv: kv[0])
    total = sum(t.numel() * t.element_size() for _, t in items)
    full = total <= FULL_HASH_LIMIT
    h = hashlib.blake2b(digest_size=16)
    h.update(b"full" if full else b"sampled")
    for name, t in items:
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
        raw = _raw_bytes(t)
        if full:
            h.update(raw.cpu().numpy().data if raw.numel() else b"")
        else:
            h.update(_sampled_digest(raw).encode())
    return h.hexdigest()


def compute_fingerprint(config: Mapping[str, Any], named_weights: Iterable[tuple[str, torch.Tensor]],
                        arena: StateArena, code_version: str, extra: Mapping[str, Any] = {}) -> str:
    """Fingerprint of (config, weights, dtypes, arena layout, code version, extra)."""
    h = hashlib.blake2b(digest_size=16)
    for part in (canonical_json(dict(config)), weights_digest(named_weights), arena.layout_key(),
                 str(code_version), canonical_json(dict(extra))):
        h.update(part.encode())
        h.update(b"\x00")
    return FINGERPRINT_PREFIX + h.hexdigest()
