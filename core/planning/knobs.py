"""The knobs that would make a plan fit, each measured: the recipe re-probed with one override and its memory per GPU
compared (``recipes.plan`` when a plan does not fit or is tight).

Each knob is the sources' own advice for running out of memory (OpenRLHF issue #354's maintainer: max_len <= 4096,
ZeRO-2/3, LoRA, gradient checkpointing, flash attention; TRL's and Open-R1's docs: a smaller per-device batch, fewer
generations, DeepSpeed's CPU offload, a lower vLLM ``gpu_memory_utilization``), written as ``fn(cfg) -> overrides
| None`` in :data:`KNOBS` (None: the recipe cannot take it, or already has it). Flash attention is not a knob: the
probe already counts attention as a flash kernel does (O(T) memory).
"""
from __future__ import annotations

from typing import Callable

from omegaconf import OmegaConf

from core.errors import InputError
from core.planning.memory import lora_on

# LoRA as OpenRLHF issue #354 ran it on 6 x RTX 4090 (--lora_rank 64 --lora_alpha 64)
LORA = ["train.lora.rank=64", "train.lora.alpha=64"]


def _halved(key: str, value: int) -> list[str] | None:
    return [f"{key}={value // 2}"] if value > 1 else None


def _lengths(cfg):
    """Half the longest sequence: the response (RL; vLLM's max_model_len follows, the prompt kept) or the pair
    (RM ``train.max_len``)."""
    if cfg.loop == "rm":
        return _halved("train.max_len", int(cfg.train.max_len))
    from core.planning.states import prompt_tokens

    new = int(cfg.rollout.max_new_tokens) // 2
    out = [f"rollout.max_new_tokens={new}"]
    if OmegaConf.select(cfg, "rollout.vllm.max_model_len"):
        out.append(f"rollout.vllm.max_model_len={prompt_tokens(cfg) + new}")
    return out if new else None


def _zero(cfg):
    stage = int(cfg.zero.stage)
    return [f"zero=stage{stage + 1}"] if stage < 3 else None


def _lora(cfg):
    return LORA if cfg.loop == "rm" and not lora_on(cfg) else None


def _checkpointing(cfg):
    return None if cfg.model.gradient_checkpointing else ["model.gradient_checkpointing=true"]


def _micro(cfg):
    return _halved("train.micro_batch_size", int(cfg.train.micro_batch_size))


def _logprob_micro(cfg):
    return _halved("train.logprob_micro_batch_size", int(cfg.train.logprob_micro_batch_size)) \
        if cfg.loop == "rl" else None


def _offload_optimizer(cfg):
    return ["zero.offload_optimizer=true"] if int(cfg.zero.stage) >= 1 and not cfg.zero.offload_optimizer else None


def _offload_params(cfg):
    z = cfg.zero
    return ["zero.offload_optimizer=true", "zero.offload_param=true"] \
        if int(z.stage) == 3 and not z.offload_param else None


def _generations(cfg):
    """Half the completions per prompt, and the mini-batch with them (the optimiser steps per step kept)."""
    if cfg.loop != "rl" or int(cfg.train.group_size) < 4:
        return None
    return [f"train.group_size={cfg.train.group_size // 2}", f"train.mini_batch_size={cfg.train.mini_batch_size // 2}"]


def _vllm_memory(cfg):
    """A colocated vLLM's ``gpu_memory_utilization`` cut by a third (rounded down to 0.05), of the card or of the free
    memory as ``gpu_memory_utilization_of`` reads it (the re-probe models both): less KV cache, fewer sequences at
    once."""
    if cfg.loop != "rl" or cfg.rollout.engine != "vllm":
        return None
    util = int(float(cfg.rollout.vllm.gpu_memory_utilization) * 2 / 3 * 20) / 20
    return [f"rollout.vllm.gpu_memory_utilization={util}"] if util > 0 else None


# (name, fn(cfg) -> the overrides of that knob for this recipe, or None where it does not apply); a fixed list, not
# a registry: no config value picks a knob, the plan tries each
KNOBS = (("shorter_lengths", _lengths), ("zero_stage", _zero), ("lora", _lora),
         ("gradient_checkpointing", _checkpointing), ("micro_batch", _micro), ("logprob_micro_batch", _logprob_micro),
         ("offload_optimizer", _offload_optimizer),
         ("offload_params", _offload_params), ("fewer_generations", _generations), ("vllm_memory", _vllm_memory))


def ranked(cfg, overrides: list[str], measure: Callable[[list[str]], dict]) -> list[dict]:
    """Every knob ``cfg`` can take, measured: ``measure(overrides + knob)`` returns the memory breakdown
    (core/planning/memory.py) of the recipe with it. Sorted by per-GPU memory, lowest first; a knob whose config the
    checks refuse is listed last with their message."""
    out = []
    for name, fn in KNOBS:
        knob = fn(cfg)
        if knob is None:
            continue
        try:
            mem = measure(overrides + knob)
        except InputError as e:  # the checks' ConfigError among them
            out.append({"knob": name, "overrides": knob, "refused": str(e).splitlines()[-1].strip()})
            continue
        kv = mem["kv_cache"]
        out.append({"knob": name, "overrides": knob, "per_gpu_bytes": mem["per_gpu_bytes"],
                    "peak_phase": mem["peak_phase"], "verdict": mem["verdict"],
                    "kv_sequences": None if kv is None else kv["sequences"]})
    return sorted(out, key=lambda k: ("refused" in k, k.get("per_gpu_bytes", 0)))
