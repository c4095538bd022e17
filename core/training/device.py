"""Where a run computes and in what precision: resolved once at setup, checked before any model is built.

``device`` (top-level config key): ``auto`` is ``cuda:<LOCAL_RANK>`` when CUDA is present (one GPU per
``torchrun`` rank), else the CPU; ``cpu``, ``cuda`` (the rank's GPU) and ``cuda:N`` name one. Every model
(policy, reference, critic, reward model) and every batch goes there.

``model.dtype`` is the precision the trained weights compute in. ``bfloat16`` is mixed precision as
DeepSpeed's bf16 mode does it: bf16 parameters, activations and gradients, with fp32 master weights and
optimiser state (the plain engine keeps its own fp32 copies, ``core.training.engine.MasterWeights``;
DeepSpeed keeps them in its optimiser). ``float32`` trains in full precision. ``float16`` is refused:
it needs loss scaling, which none of the reproduced sources use.
"""
from __future__ import annotations

import os

import torch

from core.errors import InputError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class DeviceError(InputError):
    """A device or precision this machine cannot run; raised before any model is built."""


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def fork_rng(device: torch.device):
    """``torch.random.fork_rng`` of the CPU generator and ``device``'s GPU only (none for a CPU or meta
    ``device``): its default saves and restores the generator of every visible GPU, slow and warned about
    on an 8-GPU node, where a rank draws only on its own."""
    return torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])


def resolve_device(spec: str) -> torch.device:
    """The run's device for the config value ``device`` (see the module docstring)."""
    spec = str(spec)
    if spec == "auto":
        return torch.device("cuda", local_rank()) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise DeviceError(f"device={spec}: no CUDA device is available (torch {torch.__version__}, {build}); "
                              f"use device=cpu or device=auto")
        index = local_rank() if spec == "cuda" else _index(spec)
        if index >= torch.cuda.device_count():
            raise DeviceError(f"device={spec}: GPU {index} does not exist; this machine has "
                              f"{torch.cuda.device_count()} (LOCAL_RANK={local_rank()})")
        return torch.device("cuda", index)
    raise DeviceError(f"device={spec!r}: expected auto, cpu, cuda or cuda:N")


def _index(spec: str) -> int:
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        raise DeviceError(f"device={spec!r}: expected cuda:N with an integer N") from None


def check_precision(name: str, device: torch.device, key: str = "model.dtype") -> torch.dtype:
    """The torch dtype for ``name`` if ``device`` can train in it, else a :class:`DeviceError`."""
    if name == "float16":
        raise DeviceError(f"{key}=float16: fp16 training needs loss scaling, which none of the reproduced "
                          f"sources use; use bfloat16 (mixed precision with fp32 master weights) or float32")
    if name not in DTYPES:
        raise DeviceError(f"{key}={name!r}: expected one of {sorted(DTYPES)}")
    if name == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise DeviceError(f"{key}=bfloat16: {torch.cuda.get_device_name(device)} has no bf16 support "
                          f"(compute capability {'.'.join(map(str, torch.cuda.get_device_capability(device)))}); "
                          f"use {key}=float32")
    return DTYPES[name]
