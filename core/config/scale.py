"""The ``scale`` group: shrink any recipe so it runs end to end on a CPU, keeping its ratios.

``scale=full`` leaves the recipe as published. ``scale=tiny`` swaps the model for a locally built
tiny model of the same architecture class (a critic initialised from a reward-model checkpoint becomes that
tiny model with a fresh value head: Open-Instruct's 8B RM critic), divides prompts per step by one factor
``k`` and the mini-batch by the same factor (so optimiser steps per RL step are kept), keeps the number of
accumulated micro-batches where it still divides, caps lengths, points data at local files
(the data config's ``tiny`` node) when the recipe reads from the hub, with the verifier options those need (the
verifier's ``tiny`` node: the tiny Codeforces problems' tests folder), caps DeepSpeed's communication buckets to
the tiny model, and collapses the layout to the
machine at hand (one node, every rank a learner, generation colocated: core/config/layout.py).
"""
from __future__ import annotations

import copy

from omegaconf import OmegaConf, open_dict

from core.config.layout import collapse, world_size
from core.registry import Registry

# DeepSpeed's bucket keys per ZeRO stage (zero_optimization; 5e8 elements each by default, 5e7 for the prefetch).
ZERO_BUCKETS = {1: ("reduce_bucket_size", "allgather_bucket_size"), 2: ("reduce_bucket_size", "allgather_bucket_size"),
                3: ("reduce_bucket_size", "stage3_prefetch_bucket_size")}

# Per-loop batch shrinking (``loop`` -> fn(cfg, scale) mutating cfg.train in place), one entry per loop of
# recipes/__init__.py LOOPS, here so that scaling a config never needs a loop's module imported.
SHRINKERS: Registry = Registry("scale shrinker")


def _divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, max(1, min(n, cap)) + 1) if n % d == 0)


@SHRINKERS.register("rl")
def shrink_rl(cfg, s) -> None:
    """RL batch sizes for scale ``s``: optimiser steps per RL step kept; lengths capped."""
    cfg.train.update(shrink_batches(cfg.train, s))
    cfg.train.eval_prompts = min(int(cfg.train.eval_prompts) or 8, 8)
    cfg.rollout.max_new_tokens = min(int(cfg.rollout.max_new_tokens), int(s.max_new_tokens))
    cfg.rollout.engine = "hf"
    if cfg.rollout.get("vllm") is not None:  # the layout collapses to one GPU per rank: no engine spans several
        cfg.rollout.vllm.tensor_parallel_size = 1


@SHRINKERS.register("rm")
def shrink_rm(cfg, s) -> None:
    """RM at ``scale=tiny``: ``train.tiny`` (batch sizes, steps, lengths: conf/train/rm.yaml) over ``train``."""
    if cfg.train.tiny:
        cfg.train.update({k: v for k, v in cfg.train.tiny.items()})


def shrink_batches(t, s) -> dict:
    """New ``train`` batch sizes for scale ``s``: optimiser steps per RL step kept."""
    P, G = int(t.prompts_per_step), int(t.group_size)
    updates = max(1, P * G // int(t.mini_batch_size))  # optimiser steps per RL step (per epoch)
    accum = max(1, int(t.mini_batch_size) // int(t.micro_batch_size))
    new_g = min(G, int(s.max_group_size))
    new_p = min(P, int(s.prompts_per_step))
    samples = new_p * new_g
    updates = _divisor_at_most(samples, updates)
    mini = samples // updates
    micro = mini // _divisor_at_most(mini, accum)
    return {"prompts_per_step": new_p, "group_size": new_g, "mini_batch_size": mini, "micro_batch_size": micro,
            "total_steps": min(int(t.total_steps or s.total_steps), int(s.total_steps)), "epochs": None,
            "logprob_micro_batch_size": min(int(t.logprob_micro_batch_size), samples)}


def apply_scale(cfg, keep: tuple[str, ...] = (), world: int | None = None):
    """Return ``cfg`` shrunk by ``cfg.scale`` (a copy with its schema types; the input is not modified).
    The values of ``keep`` (the keys set on the command line, :func:`command_line_keys`) are the user's:
    the scale does not change them (``scale=tiny train.total_steps=10`` runs 10 steps). ``world``: the ranks
    the layout collapses to (default: this process's, WORLD_SIZE)."""
    if cfg.scale.name == "full":
        return cfg
    cfg = copy.deepcopy(cfg)
    given = {k: OmegaConf.select(cfg, k, default=None) for k in keep}
    kept = {k: v for k, v in given.items() if v is not None and not OmegaConf.is_dict(v)}  # values, not groups
    s = cfg.scale
    cfg.model.name_or_path = None
    cfg.model.tiny = s.model
    cfg.model.dtype = "float32"
    cfg.model.attn_implementation = "sdpa"
    if OmegaConf.select(cfg, "advantage.critic.init_from"):  # a reward-model checkpoint: the tiny policy's weights
        cfg.advantage.critic.init_from = None
    for group in ("data", "verifier"):  # local stand-ins for a hub dataset, and the verifier options they need
        if OmegaConf.select(cfg, f"{group}.tiny"):
            with open_dict(cfg[group]):  # a tiny node may add keys to a free-form dict (verifier.eval_kwargs)
                merged = OmegaConf.merge(cfg[group], cfg[group].tiny)
            OmegaConf.set_struct(merged, OmegaConf.is_struct(cfg))
            cfg[group] = merged
    buckets = ZERO_BUCKETS.get(int(cfg.zero.stage), ())
    if s.zero_bucket_size and buckets:  # DeepSpeed allocates its buckets whole
        cfg.zero.options = OmegaConf.merge(dict.fromkeys(buckets, int(s.zero_bucket_size)), cfg.zero.options)
    SHRINKERS.get(cfg.loop)(cfg, s)
    cfg.layout.update(collapse(world_size() if world is None else world))
    for key, value in kept.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def command_line_keys() -> tuple[str, ...]:
    """The config keys this Hydra job sets on its command line (none outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not HydraConfig.initialized():
        return ()
    overrides = OverridesParser.create().parse_overrides(list(HydraConfig.get().overrides.task))
    return tuple(o.key_or_group for o in overrides if not o.is_delete())
