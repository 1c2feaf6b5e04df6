"""The start-up check that the installed torch has kernels for the GPU (issue #50, item 10): the
decision on made-up arch lists and capabilities, and the node's device resolution refusing a GPU
its torch cannot run on (torch.cuda faked: no GPU here)."""
from __future__ import annotations

import pytest
import torch

from flashrt_ros.engine.cuda_arch import missing_kernels, runs_on
from flashrt_ros.runtime.errors import InvalidArgument

#: what torch.cuda.get_arch_list() returned for some builds (the CUDA 12.8 x86 wheel; PyPI's 2.14.1
#: aarch64 wheel, which is a cu130 build: read from its libtorch_cuda.so)
CU128 = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"]
CU130_AARCH64 = ["sm_80", "sm_90", "sm_100", "sm_110", "sm_120"]
THOR, ORIN, H100, RTX4090 = (11, 0), (8, 7), (9, 0), (8, 9)


@pytest.mark.parametrize("capability, arch_list, runs", [
    (THOR, CU128, False),                 # the case that motivated the check: CUDA 12 torch on Thor
    (THOR, CU130_AARCH64, True),
    (ORIN, CU128, True),                  # sm_86 machine code runs on 8.7 (same major, lower minor)
    (ORIN, ["sm_90", "sm_100"], False),   # newer machine code never runs on an older GPU
    (H100, ["sm_90a"], True),
    (RTX4090, ["sm_90a", "compute_90a"], False),   # arch-specific code: that GPU only
    (THOR, ["sm_80", "compute_80"], True),         # PTX is compiled for any newer GPU, across majors
    (THOR, ["sm_120", "compute_120"], False),      # ... never for an older one
    (THOR, ["sm_100f"], False),                    # a family stays within its major
    ((10, 3), ["sm_100f"], True),
])
def test_the_decision_follows_cudas_compatibility_rules(capability, arch_list, runs):
    assert (missing_kernels(capability, arch_list) is None) is runs


def test_the_refusal_names_the_gpu_what_the_wheel_carries_and_what_to_install():
    text = missing_kernels(THOR, CU128, "NVIDIA Thor", "2.7.0+cu128")
    assert text.startswith("torch 2.7.0+cu128 has no kernels for this GPU (NVIDIA Thor, compute capability 11.0, "
                           "sm_110): it carries sm_50 sm_60")
    assert "CUDA 13" in text and "docs/jetson.md" in text and "device:=cpu" in text


def test_an_empty_or_odd_arch_list_never_refuses():
    assert missing_kernels(THOR, []) is None                 # a build that does not say: no verdict
    assert not runs_on("gfx90a", THOR) and runs_on(" sm_110 ", THOR)


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch.cuda as a machine with one GPU of a chosen capability and a chosen torch arch list."""
    gpu = {"capability": THOR, "arch_list": CU128}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: gpu["capability"])
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(gpu["arch_list"]))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Thor")
    return gpu


@pytest.mark.parametrize("name", ["auto", "cuda", "cuda:0"])
def test_the_node_refuses_a_gpu_its_torch_has_no_kernels_for(fake_gpu, name):
    from flashrt_ros.engine.factory import resolve_device
    with pytest.raises(InvalidArgument, match=r"has no kernels for this GPU \(NVIDIA Thor, compute capability 11.0"):
        resolve_device(name)
    fake_gpu["arch_list"] = CU130_AARCH64
    assert resolve_device(name).type == "cuda"
    assert resolve_device("cpu").type == "cpu"


def test_configure_fails_with_the_reason_before_loading_anything(fake_gpu, tmp_path):
    from types import SimpleNamespace

    from flashrt_ros.engine.factory import build_engine
    config = SimpleNamespace(device="auto", dtype="auto", capsule_directory=str(tmp_path), engine_kind="policy",
                             policy="gru", capsule_device_budget_mb=1, capsule_host_budget_mb=1,
                             capsule_disk_budget_mb=1)
    with pytest.raises(InvalidArgument, match="sm_110"):
        build_engine(config, log=lambda _m: None)
