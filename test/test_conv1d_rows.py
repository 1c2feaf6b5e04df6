"""The CPU row-GEMM form of the UNet's 1-D convolutions computes ``nn.Conv1d`` / ``nn.ConvTranspose1d`` (to float
rounding), and only plain fp32 / bf16 zero-padded ones take it: everything else runs the module itself, unchanged."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from flashrt_ros.models.lerobot.conv1d import conv1d, rows_conv1d

SHAPES = [  # (in, out, k, stride, padding, T): the Conv1dBlock, residual, down-sampling and final convs
    (6, 16, 5, 1, 2, 16), (16, 32, 3, 1, 1, 8), (32, 32, 3, 2, 1, 8), (32, 16, 1, 1, 0, 4), (48, 24, 5, 1, 2, 3),
]


@pytest.mark.parametrize("cin,cout,k,stride,pad,steps", SHAPES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_equal_the_module(cin, cout, k, stride, pad, steps, batch, bias, dtype):
    torch.manual_seed(0)
    conv = nn.Conv1d(cin, cout, k, stride, pad, bias=bias).to(dtype)
    x = torch.randn(batch, cin, steps).to(dtype)
    expected = conv(x)
    got = conv1d(conv, x)
    assert got.shape == expected.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    assert torch.equal(rows_conv1d(conv, x), got)


@pytest.mark.parametrize("cin,cout,k,stride,pad,steps", [(16, 16, 4, 2, 1, 4), (8, 12, 3, 1, 1, 5), (6, 4, 4, 2, 0, 3)])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_equal_the_transposed_module(cin, cout, k, stride, pad, steps, batch, bias, dtype):
    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(cin, cout, k, stride, pad, bias=bias).to(dtype)
    x = torch.randn(batch, cin, steps).to(dtype)
    expected = conv(x)
    got = conv1d(conv, x)
    assert got.shape == expected.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


def test_other_modules_and_dtypes_run_themselves(monkeypatch):
    torch.manual_seed(0)
    calls = []
    monkeypatch.setattr("flashrt_ros.models.lerobot.conv1d.rows_conv1d", lambda c, x: calls.append(c))
    monkeypatch.setattr("flashrt_ros.models.lerobot.conv1d.rows_conv_transpose1d", lambda c, x: calls.append(c))
    x = torch.randn(1, 8, 6)
    for module in (nn.Identity(), nn.Conv1d(8, 8, 3, padding=1, groups=2), nn.Conv1d(8, 8, 3, padding=2, dilation=2),
                   nn.Conv1d(8, 8, 3, padding=1, padding_mode="circular"), nn.Conv1d(8, 8, 3, padding="same"),
                   nn.ConvTranspose1d(8, 8, 4, 2, 1, output_padding=1), nn.ConvTranspose1d(8, 8, 3, groups=2)):
        assert torch.equal(conv1d(module, x), module(x))
    double = nn.Conv1d(8, 8, 3, padding=1).double()
    assert torch.equal(conv1d(double, x.double()), double(x.double()))
    assert calls == []
