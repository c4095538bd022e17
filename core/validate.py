"""Config checks that run before any model is built: batch arithmetic and registry names.

Every problem found is collected and raised together, each naming the keys and values that clash.
"""
from __future__ import annotations

from core.advantage import ADVANTAGES
from core.loss import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem found."""


def _check_names(cfg, errors: list[str]) -> None:
    for key, reg in (("advantage.name", ADVANTAGES), ("loss.name", POLICY_LOSSES),
                     ("loss.aggregation", AGGREGATIONS), ("kl.estimator", KL_ESTIMATORS)):
        group, field = key.split(".")
        name = cfg[group][field]
        if name not in reg:
            errors.append(f"{key}={name!r} is not registered; choose one of {reg.names()}")


def rl_batch_plan(cfg, world_size: int = 1) -> dict[str, int]:
    """The batch arithmetic of one RL step, derived from ``train.*`` (see conf/train/grpo.yaml)."""
    t = cfg.train
    samples = int(t.prompts_per_step) * int(t.group_size)
    per_update = int(t.mini_batch_size)
    micro = int(t.micro_batch_size)
    return {
        "samples_per_step": samples,
        "optimizer_steps_per_rl_step": (samples // per_update) * int(t.ppo_epochs) if per_update else 0,
        "grad_accum": per_update // (micro * world_size) if micro * world_size else 0,
        "world_size": world_size,
    }


def check_rl(cfg, world_size: int = 1, num_train_rows: int | None = None) -> dict[str, int]:
    """Raise :class:`ConfigError` unless the RL batch sizes divide; return the batch plan."""
    t, errors = cfg.train, []
    _check_names(cfg, errors)
    for key in ("total_steps", "prompts_per_step", "group_size", "mini_batch_size", "micro_batch_size",
                "ppo_epochs", "logprob_micro_batch_size"):
        if int(t[key]) < 1:
            errors.append(f"train.{key}={t[key]} must be >= 1")
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
    samples = int(t.prompts_per_step) * int(t.group_size)
    min_group = ADVANTAGES.meta(cfg.advantage.name).get("min_group_size", 1)
    if int(t.group_size) < min_group:
        errors.append(f"train.group_size={t.group_size}: advantage.name={cfg.advantage.name} compares "
                      f"completions of one prompt and needs group_size >= {min_group}")
    if samples % int(t.mini_batch_size):
        errors.append(f"train.prompts_per_step x train.group_size = {t.prompts_per_step} x {t.group_size} = "
                      f"{samples} completions is not divisible by train.mini_batch_size={t.mini_batch_size}")
    if int(t.mini_batch_size) % (int(t.micro_batch_size) * world_size):
        errors.append(f"train.mini_batch_size={t.mini_batch_size} is not divisible by train.micro_batch_size x "
                      f"world size = {t.micro_batch_size} x {world_size}")
    if num_train_rows is not None and int(t.prompts_per_step) > num_train_rows:
        errors.append(f"train.prompts_per_step={t.prompts_per_step} is larger than the training set "
                      f"({num_train_rows} rows after filtering)")
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
    return rl_batch_plan(cfg, world_size)
