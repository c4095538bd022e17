"""The optimiser and its schedule, as the engines build them (core/training/engine.py): ``optim.optimizer`` a
``_partial_`` ``_target_`` node, DeepSpeed's CPU Adam for ZeRO-Offload, transformers' named schedules, and the
values a resume may change put back into a restored optimiser."""
from __future__ import annotations

import math

from hydra.utils import instantiate


def scheduler_names() -> list[str]:
    """The names ``transformers.get_scheduler`` knows (``optim.scheduler.name``)."""
    from transformers import SchedulerType

    return sorted(s.value for s in SchedulerType)


def warmup_steps(sched_cfg, total_steps: int) -> int:
    """Warmup optimiser steps of ``optim.scheduler``: ``ceil(warmup_ratio x total_steps)`` when the ratio is set,
    else ``warmup_steps``. ``warmup_override_bug`` is Open-Instruct's release rule (allenai/open-instruct@3dd7a07d
    ``ppo_vllm_thread_ray_gtrl.py``, ``grpo_vllm_thread_ray_gtrl.py`` until 1e3c5b626, #579): ``if
    args.warmup_ratio >= 0.0: warm_up_steps = int(num_training_steps * args.warmup_ratio)``, always true, so
    ``warmup_steps`` is ignored and the ratio's warmup is rounded down."""
    if sched_cfg.warmup_override_bug:
        return int(total_steps * float(sched_cfg.warmup_ratio))
    if sched_cfg.warmup_ratio:
        return math.ceil(float(sched_cfg.warmup_ratio) * total_steps)
    return int(sched_cfg.warmup_steps)


def build_scheduler(optimizer, sched_cfg, total_steps: int):
    """``transformers.get_scheduler`` with :func:`warmup_steps` of ``total_steps`` optimiser steps."""
    from transformers import get_scheduler

    extra = dict(sched_cfg.kwargs)
    return get_scheduler(sched_cfg.name, optimizer, num_warmup_steps=warmup_steps(sched_cfg, total_steps),
                         num_training_steps=total_steps, scheduler_specific_kwargs=extra or None)


def build_optimizer(params, optim_cfg):
    """Instantiate ``optim.optimizer`` (a ``_partial_`` ``_target_`` node) on ``params``; null keys are the
    optimiser's own defaults, so they are not passed."""
    return instantiate(optimizer_kwargs(optim_cfg.optimizer))(params)


# The optim.optimizer targets DeepSpeed's CPU Adam computes exactly, and its adamw_mode for each: decoupled weight
# decay (AdamW) or L2 added to the gradient (Adam), as in deepspeed/ops/csrc/includes/cpu_adam.h.
CPU_ADAM_MODES = {"torch.optim.AdamW": True, "torch.optim.Adam": False}
CPU_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")


def cpu_adam(params, optim_cfg):
    """``optim.optimizer`` as DeepSpeed's ``DeepSpeedCPUAdam``, the optimiser ZeRO-Offload steps on the CPU
    (DeepSpeed refuses a client torch optimiser there: ``zero_force_ds_cpu_optimizer``). OpenRLHF builds it
    under ``--adam_offload`` (openrlhf/utils/deepspeed/deepspeed.py ``create_optimizer``); Open-R1/TRL let
    DeepSpeed build it (accelerate's plugin). A null key takes the torch optimiser's own default, not CPU Adam's
    (torch's AdamW decays by 0.01, CPU Adam by 0), so the update is the one the config names; ``fused`` is a
    kernel choice and has no CPU Adam counterpart. Targets outside :data:`CPU_ADAM_MODES` are refused in
    core/config/validate.py."""
    import inspect

    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from hydra.utils import get_class

    given, target = optimizer_kwargs(optim_cfg.optimizer), optim_cfg.optimizer._target_
    defaults = {k: p.default for k, p in inspect.signature(get_class(target)).parameters.items()}
    settings = {k: given.get(k, defaults[k]) for k in CPU_ADAM_KEYS}
    return DeepSpeedCPUAdam(params, lr=float(settings["lr"]), betas=tuple(settings["betas"]),
                            eps=float(settings["eps"]), weight_decay=float(settings["weight_decay"]),
                            adamw_mode=CPU_ADAM_MODES[target])


def optimizer_kwargs(node) -> dict:
    """``optim.optimizer`` as a plain dict without its null keys."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    return {k: v for k, v in plain.items() if v is not None}


def retune(optimizer, scheduler, optimizer_cfg) -> None:
    """Put ``optim.optimizer``'s values into a restored optimiser (``resume_allow_changes``): the checkpoint's
    state holds the old learning rate (param groups, the schedule's ``base_lrs``) and would silently win. The
    new rate is applied at the schedule's current step; betas, eps and weight decay replace the old ones.
    The schedule's shape is the config's already (its lambdas are rebuilt, not restored)."""
    lr = float(optimizer_cfg.lr)
    other = {k: tuple(v) if isinstance(v, list) else v for k, v in optimizer_kwargs(optimizer_cfg).items()
             if not k.startswith("_") and k not in ("lr", "fused")}
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
        group.update({k: v for k, v in other.items() if k in group})
    if scheduler is None:
        for group in optimizer.param_groups:
            group["lr"] = lr
        return
    scheduler.base_lrs = [lr] * len(optimizer.param_groups)
    for group, fn in zip(optimizer.param_groups, scheduler.lr_lambdas):  # HF schedules are LambdaLR
        group["lr"] = lr * fn(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
