"""Config checks that run before any model is built: batch arithmetic, registry names and
incompatible combinations.

Every problem found is collected and raised together, each naming the keys and values that clash.
"""
from __future__ import annotations

from core.algorithms.advantage import ADVANTAGES, WHITENING
from core.algorithms.kl_control import KL_CONTROLLERS
from core.algorithms.loss import AGGREGATIONS, IS_CORRECTIONS, KL_ESTIMATORS, POLICY_LOSSES
from core.algorithms.shaping import NONE_REWARDS
from core.models.packing import MODES as PACKING_MODES


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem found."""


KL_PLACEMENTS = ("reward", "loss")
_NAMED = (("advantage.name", ADVANTAGES), ("advantage.whiten", WHITENING), ("loss.name", POLICY_LOSSES),
          ("loss.aggregation", AGGREGATIONS), ("loss.is_correction.mode", IS_CORRECTIONS),
          ("kl.estimator", KL_ESTIMATORS), ("kl.controller", KL_CONTROLLERS))
_DEFAULTS = {"advantage.whiten": "none", "loss.is_correction.mode": "none", "kl.controller": "fixed"}


def _select(cfg, key: str):
    node = cfg
    for part in key.split("."):
        node = node.get(part) if node is not None and hasattr(node, "get") else None
    return _DEFAULTS.get(key) if node is None else node


def _check_names(cfg, errors: list[str]) -> None:
    for key, reg in _NAMED:
        name = _select(cfg, key)
        if name not in reg:
            errors.append(f"{key}={name!r} is not registered; choose one of {reg.names()}")
    if cfg.kl.placement not in KL_PLACEMENTS:
        errors.append(f"kl.placement={cfg.kl.placement!r}; choose one of {list(KL_PLACEMENTS)}")
    if cfg.advantage.name in ADVANTAGES:  # per-estimator option values declared at registration
        for key, allowed in ADVANTAGES.meta(cfg.advantage.name).get("choices", {}).items():
            if cfg.advantage.get(key) not in allowed:
                errors.append(f"advantage.{key}={cfg.advantage.get(key)!r} with advantage.name={cfg.advantage.name}; "
                              f"choose one of {sorted(allowed)}")


def _check_critic(cfg, errors: list[str]) -> None:
    needs = ADVANTAGES.meta(cfg.advantage.name).get("needs_values", False)
    has = bool(cfg.advantage.get("critic"))
    if needs and not has:
        errors.append(f"advantage.name={cfg.advantage.name} needs a value model but advantage.critic is not set "
                      f"(use the config option advantage={cfg.advantage.name}, which defines it)")
    if has and not needs:
        errors.append(f"advantage.critic is set but advantage.name={cfg.advantage.name} does not use values "
                      f"(only {[n for n in ADVANTAGES.names() if ADVANTAGES.meta(n).get('needs_values')]} do)")


def _check_kl(cfg, errors: list[str]) -> None:
    kl, coef = cfg.kl, float(cfg.kl.coef)
    ref = kl.get("reference", "auto")
    if ref not in ("auto", True, False):
        errors.append(f"kl.reference={ref!r}; choose auto, true or false")
    if ref is True and coef == 0:
        errors.append(f"kl.reference=true with kl.coef=0 (kl.placement={kl.placement}): a reference model would "
                      f"be built but never used; set kl.coef > 0 or kl.reference=auto")
    if ref is False and coef > 0:
        errors.append(f"kl.reference=false with kl.coef={coef}: the KL penalty needs the reference model")
    controller = _select(cfg, "kl.controller")
    if controller in KL_CONTROLLERS and KL_CONTROLLERS.meta(controller).get("needs_target"):
        if kl.placement != "reward":
            errors.append(f"kl.controller={controller} with kl.placement={kl.placement}: the adaptive controller "
                          f"tunes the in-reward penalty (OpenRLHF, veRL); use kl.placement=reward")
        if not kl.get("target") or float(kl.target) <= 0 or not kl.get("horizon"):
            errors.append(f"kl.controller={controller} needs kl.target > 0 and kl.horizon > 0")


def _check_loss(cfg, errors: list[str]) -> None:
    loss = cfg.loss
    if float(loss.clip_low) < 0 or float(loss.clip_low) >= 1 or float(loss.clip_high) < 0:
        errors.append(f"loss.clip_low={loss.clip_low} must be in [0, 1) and loss.clip_high={loss.clip_high} >= 0")
    if loss.get("dual_clip") and float(loss.dual_clip) <= 1:
        errors.append(f"loss.dual_clip={loss.dual_clip} must be > 1 (or null to disable)")
    isc = loss.get("is_correction") or {}
    if isc.get("mode", "none") != "none" and not isc.get("high"):
        errors.append(f"loss.is_correction.mode={isc.get('mode')} needs loss.is_correction.high")


def _check_placement(cfg, errors: list[str]) -> None:
    """Settings that the device and the sharding cannot honour."""
    if cfg.train.get("packing", "auto") not in PACKING_MODES:
        errors.append(f"train.packing={cfg.train.packing!r}; choose one of auto, true, false")
    if int(cfg.zero.stage) == 3 and int(cfg.train.warm_start.steps) > 0:
        errors.append(f"train.warm_start.steps={cfg.train.warm_start.steps} with zero.stage=3: the warm start trains a "
                      f"full copy of the model in one process before ZeRO-3 shards it; start from a checkpoint that "
                      f"needs none (train.warm_start.steps=0), or warm-start under zero=none|stage1|stage2")


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


def _raise(errors: list[str]) -> None:
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


def check_rl(cfg, world_size: int = 1, num_train_rows: int | None = None) -> dict[str, int]:
    """Raise :class:`ConfigError` unless names resolve, combinations fit and batch sizes divide;
    return the batch plan."""
    t, errors = cfg.train, []
    _check_names(cfg, errors)
    for key in ("total_steps", "prompts_per_step", "group_size", "mini_batch_size", "micro_batch_size",
                "ppo_epochs", "logprob_micro_batch_size"):
        if int(t[key]) < 1:
            errors.append(f"train.{key}={t[key]} must be >= 1")
    if any(e.startswith("train.") for e in errors):
        _raise(errors)  # the arithmetic below divides by these
    _check_kl(cfg, errors)
    _check_loss(cfg, errors)
    _check_placement(cfg, errors)
    samples = int(t.prompts_per_step) * int(t.group_size)
    known = cfg.advantage.name in ADVANTAGES
    if known:
        _check_critic(cfg, errors)
    min_group = ADVANTAGES.meta(cfg.advantage.name).get("min_group_size", 1) if known else 1
    if int(t.group_size) < min_group:
        errors.append(f"train.group_size={t.group_size}: advantage.name={cfg.advantage.name} compares "
                      f"completions of one prompt and needs group_size >= {min_group}")
    none_reward = (t.get("shaping") or {}).get("none_reward", "mask")
    if none_reward not in NONE_REWARDS:
        errors.append(f"train.shaping.none_reward={none_reward!r}: choose one of {sorted(NONE_REWARDS)}")
    elif none_reward == "exclude" and known and not ADVANTAGES.meta(cfg.advantage.name).get("excludes_nan"):
        errors.append(f"train.shaping.none_reward=exclude leaves unscored samples out of group statistics, which "
                      f"advantage.name={cfg.advantage.name} does not support; use one of "
                      f"{[n for n in ADVANTAGES.names() if ADVANTAGES.meta(n).get('excludes_nan')]} or "
                      f"none_reward=mask|zero")
    if samples % int(t.mini_batch_size):
        errors.append(f"train.prompts_per_step x train.group_size = {t.prompts_per_step} x {t.group_size} = "
                      f"{samples} completions is not divisible by train.mini_batch_size={t.mini_batch_size}")
    if int(t.prompts_per_step) % world_size:
        errors.append(f"train.prompts_per_step={t.prompts_per_step} is not divisible by the world size "
                      f"{world_size}: each rank takes whole groups of prompts")
    if int(t.mini_batch_size) % (int(t.micro_batch_size) * world_size):
        errors.append(f"train.mini_batch_size={t.mini_batch_size} is not divisible by train.micro_batch_size x "
                      f"world size = {t.micro_batch_size} x {world_size}")
    if num_train_rows is not None and int(t.prompts_per_step) > num_train_rows:
        errors.append(f"train.prompts_per_step={t.prompts_per_step} is larger than the training set "
                      f"({num_train_rows} rows after filtering)")
    _raise(errors)
    return rl_batch_plan(cfg, world_size)
