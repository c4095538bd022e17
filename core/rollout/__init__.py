"""Rollout engines: sample completions for a batch of prompts, keyed by config name (``rollout.engine``).

``hf`` (Hugging Face ``generate`` on the training model, any device), ``vllm`` (:mod:`core.rollout.vllm`,
colocated, GPU only) and ``vllm_server`` (:mod:`core.rollout.server`, vLLM servers on GPUs of their own) are
each imported when asked for. Every engine is built from
``(model, tokenizer, rollout_cfg)``, and the loop calls the same members on each:

- ``sync_weights(engine)``: the optimiser engine's current weights into the sampler (``hf``: nothing to
  copy; ``vllm``: pushed one parameter at a time, each gathered alone under ZeRO-3). Every rank calls it;
- ``gathers_policy``: the loop holds the policy gathered whole around ``generate`` under ZeRO-3
  (``engine.gathered``); true only for ``hf`` with ``rollout.gather_for_generation``;
- ``collective``: ``generate`` takes part in collectives, so every rank calls it, with a stand-in prompt
  when it has none (``hf`` on partitioned ZeRO-3 weights, ``vllm`` with tensor parallelism);
- ``generate(prompts, sampling)``: a :class:`core.rollout.batch.RolloutBatch`.
"""
from __future__ import annotations

import importlib
from typing import Callable

from core.rollout.batch import RolloutBatch, Sampling  # noqa: F401  (the package's public types)

_ENGINES: dict[str, Callable] = {}
# Each engine's module, imported (and so registered) when the engine is first asked for: vllm's imports
# GPU-only packages, and no run pays for an engine it does not use.
_LAZY = {"hf": "core.rollout.hf", "vllm": "core.rollout.vllm", "vllm_server": "core.rollout.server"}


def register_rollout(name: str):
    def deco(cls):
        if name in _ENGINES and _ENGINES[name] is not cls:
            raise ValueError(f"rollout engine {name!r} is already registered")
        _ENGINES[name] = cls
        return cls

    return deco


def rollout_engines() -> list[str]:
    return sorted({*_ENGINES, *_LAZY})


def build_rollout(name: str, model, tokenizer, cfg):
    """The engine registered as ``name`` (its module imported first)."""
    if name not in _ENGINES and name in _LAZY:
        importlib.import_module(_LAZY[name])
    if name not in _ENGINES:
        raise KeyError(f"unknown rollout.engine {name!r}; registered: {', '.join(rollout_engines())}")
    return _ENGINES[name](model, tokenizer, cfg)
