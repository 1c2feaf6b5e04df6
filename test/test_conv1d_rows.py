"""The CPU row-GEMM form of the UNet's 1-D convolutions computes ``nn.Conv1d`` / ``nn.ConvTranspose1d`` (to float
rounding); the dispatch sends it only plain fp32 / bf16 zero-padded ones where it pays (short outputs, large
weights): everything else runs the module itself, unchanged."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from flashrt_ros.models.lerobot.diffusion import conv1d as rows

SHAPES = [  # (in, out, k, stride, padding, T): the Conv1dBlock, residual, down-sampling and final convs
    (6, 16, 5, 1, 2, 16), (16, 32, 3, 1, 1, 8), (32, 32, 3, 2, 1, 8), (32, 16, 1, 1, 0, 4), (48, 24, 5, 1, 2, 3),
]
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def _close(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert got.shape == expected.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("cin,cout,k,stride,pad,steps", SHAPES)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("bias", [True, False])
@DTYPES
def test_rows_equal_the_module(cin, cout, k, stride, pad, steps, batch, bias, dtype):
    torch.manual_seed(0)
    conv = nn.Conv1d(cin, cout, k, stride, pad, bias=bias).to(dtype)
    x = torch.randn(batch, cin, steps).to(dtype)
    _close(rows.rows_conv1d(conv, x), conv(x), dtype)


@pytest.mark.parametrize("cin,cout,k,stride,pad,steps", [(16, 16, 4, 2, 1, 4), (8, 12, 3, 1, 1, 5), (6, 4, 4, 2, 0, 3)])
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
@DTYPES
def test_rows_equal_the_transposed_module(cin, cout, k, stride, pad, steps, batch, bias, dtype):
    torch.manual_seed(0)
    conv = nn.ConvTranspose1d(cin, cout, k, stride, pad, bias=bias).to(dtype)
    x = torch.randn(batch, cin, steps).to(dtype)
    _close(rows.rows_conv_transpose1d(conv, x), conv(x), dtype)


def test_the_rows_form_runs_only_where_it_pays(monkeypatch):
    torch.manual_seed(0)
    taken: list[nn.Module] = []
    monkeypatch.setattr(rows, "rows_conv1d", lambda c, x: taken.append(c) or c(x))
    monkeypatch.setattr(rows, "rows_conv_transpose1d", lambda c, x: taken.append(c) or c(x))
    cases = [  # (module, time steps of the input, takes the rows form)
        (nn.Conv1d(64, 64, 5, padding=2), 8, True),          # short output, 20480 weights
        (nn.Conv1d(64, 64, 3, 2, 1), 16, True),              # stride 2: 8 output steps
        (nn.Conv1d(64, 64, 5, padding=2), 16, False),        # 16 output steps: F.conv1d is as fast
        (nn.Conv1d(16, 32, 3, padding=1), 8, False),         # 1536 weights: the fixed cost dominates
        (nn.ConvTranspose1d(64, 64, 4, 2, 1), 8, True),
        (nn.ConvTranspose1d(32, 32, 4, 2, 1), 8, False),
        (nn.Identity(), 8, False),
        (nn.Conv1d(64, 64, 3, padding=1, groups=2), 8, False),
        (nn.Conv1d(64, 64, 3, padding=2, dilation=2), 8, False),
        (nn.Conv1d(64, 64, 3, padding=1, padding_mode="circular"), 8, False),
        (nn.Conv1d(64, 64, 3, padding="same"), 8, False),
        (nn.ConvTranspose1d(64, 64, 4, 2, 1, output_padding=1), 8, False),
    ]
    for module, steps, expected in cases:
        taken.clear()
        x = torch.randn(1, getattr(module, "in_channels", 64), steps)
        assert torch.equal(rows.conv1d(module, x), module(x))
        assert bool(taken) == expected, module
    double, x = nn.Conv1d(64, 64, 5, padding=2).double(), torch.randn(1, 64, 8).double()
    taken.clear()
    assert torch.equal(rows.conv1d(double, x), double(x)) and not taken      # fp64: the module itself
