"""``core.training.device``: the run's device and precision, resolved and checked before any model is built
(CUDA's presence is simulated where this machine has none)."""
from __future__ import annotations

import pytest
import torch

from core.training.device import DeviceError, check_precision, resolve_device


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_auto_is_the_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_and_cuda_are_this_ranks_gpu(two_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)


@pytest.mark.parametrize("spec, message", [
    ("cuda:2", "device=cuda:2: GPU 2 does not exist; this machine has 2"),
    ("cuda:x", "device='cuda:x': expected cuda:N with an integer N"),
    ("tpu", "device='tpu': expected auto, cpu, cuda or cuda:N"),
])
def test_bad_devices_say_what_would_work(two_gpus, spec, message):
    with pytest.raises(DeviceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_device(spec)


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceError, match="device=cuda: no CUDA device is available"):
        resolve_device("cuda")


def test_precisions():
    cpu = torch.device("cpu")
    assert check_precision("float32", cpu) is torch.float32
    assert check_precision("bfloat16", cpu) is torch.bfloat16
    with pytest.raises(DeviceError, match="model.dtype=float16: fp16 training needs loss scaling"):
        check_precision("float16", cpu)
    with pytest.raises(DeviceError, match="model.dtype='fp8': expected one of"):
        check_precision("fp8", cpu)


def test_bf16_on_a_gpu_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 0))
    with pytest.raises(DeviceError, match="bfloat16: Tesla V100 has no bf16 support .compute capability 7.0"):
        check_precision("bfloat16", torch.device("cuda", 0))
