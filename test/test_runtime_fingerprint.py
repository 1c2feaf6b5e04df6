"""The fingerprint changes with anything that changes what capsule bytes mean."""
from __future__ import annotations

import torch

from flashrt_ros.runtime import fingerprint as fpmod
from flashrt_ros.runtime.fingerprint import compute_fingerprint
from flashrt_ros.runtime.toy import toy_arena


def weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [("w.b", torch.randn(8, 4, generator=g)), ("w.a", torch.randn(3, generator=g).to(torch.bfloat16))]


CONFIG = {"layers": 2, "hidden": 8, "rope_theta": 1e6}


def fp(config=CONFIG, named=None, arena=None, code="v1", extra={}):
    return compute_fingerprint(config, named if named is not None else weights(), arena or toy_arena(), code, extra)


def test_fingerprint_is_stable_and_order_independent():
    assert fp() == fp()
    assert fp(named=list(reversed(weights()))) == fp()
    assert fp(config=dict(reversed(list(CONFIG.items())))) == fp()


def test_fingerprint_changes_with_config_weights_dtype_layout_code_and_extra():
    base = fp()
    w = weights()
    w[0][1][0, 0] += 1e-3
    wd = [(n, t.float()) for n, t in weights()]
    others = [fp(config={**CONFIG, "layers": 3}), fp(named=w), fp(named=wd), fp(arena=toy_arena(max_len=32)),
              fp(code="v2"), fp(extra={"kernels": "fla-0.6.0"})]
    assert len({base, *others}) == 1 + len(others)


def test_sampled_mode_for_large_models_still_sees_a_single_byte_change(monkeypatch):
    monkeypatch.setattr(fpmod, "FULL_HASH_LIMIT", 64)
    monkeypatch.setattr(fpmod, "SAMPLE_CHUNKS", 2)          # samples only the first and last 16 bytes
    monkeypatch.setattr(fpmod, "SAMPLE_CHUNK_BYTES", 16)
    big = torch.arange(100_000, dtype=torch.float32)
    base = fp(named=[("big", big)])
    changed = big.clone()
    changed.view(torch.uint8)[217_001] ^= 0x04   # one bit outside every sampled chunk: caught by the byte sum
    assert fp(named=[("big", changed)]) != base
    assert fp(named=[("big", big.clone())]) == base
