"""The optimiser and its schedule, as the engines build them (core/training/engine.py): ``optim.optimizer`` a
``_partial_`` ``_target_`` node, DeepSpeed's CPU Adam for ZeRO-Offload, the named schedules (transformers' and
:data:`SCHEDULES`), and the values a resume may change put back into a restored optimiser."""
from __future__ import annotations

import math
from functools import partial

from hydra.utils import instantiate

from core.registry import Registry

# The schedules of our own (``optim.scheduler.name``), each ``(optimizer, sched_cfg, total_steps, per_step) ->
# LambdaLR`` over ``total_steps`` optimiser steps, ``per_step`` of them per RL step; meta ``per_rl_step``: its
# value changes once per RL step, its warmup counts RL steps. Every other name is transformers.get_scheduler's.
SCHEDULES: Registry = Registry("optim.scheduler.name")


def scheduler_names() -> list[str]:
    """The names ``optim.scheduler.name`` takes: ``transformers.get_scheduler``'s and :data:`SCHEDULES`'."""
    from transformers import SchedulerType

    return sorted({s.value for s in SchedulerType} | set(SCHEDULES.names()))


def per_rl_step(name: str) -> bool:
    """Schedule ``name`` takes one value per RL step and counts its warmup in RL steps (veRL's)."""
    return name in SCHEDULES and bool(SCHEDULES.meta(name).get("per_rl_step"))


def warmup_steps(sched_cfg, total_steps: int) -> int:
    """Warmup steps of ``optim.scheduler`` over ``total_steps`` of its steps (optimiser steps; RL steps for a
    :func:`per_rl_step` schedule): ``ceil(warmup_ratio x total_steps)`` when the ratio is set (the HF Trainer's
    ``get_warmup_steps``; veRL rounds down: fsdp_workers.py ``int(lr_warmup_steps_ratio * total_steps)``), else
    ``warmup_steps``. ``warmup_override_bug`` is Open-Instruct's release rule (allenai/open-instruct@3dd7a07d
    ``ppo_vllm_thread_ray_gtrl.py``, ``grpo_vllm_thread_ray_gtrl.py`` until 1e3c5b626, #579): ``if
    args.warmup_ratio >= 0.0: warm_up_steps = int(num_training_steps * args.warmup_ratio)``, always true, so
    ``warmup_steps`` is ignored and the ratio's warmup is rounded down."""
    ratio = float(sched_cfg.warmup_ratio)
    if sched_cfg.warmup_override_bug or (ratio and per_rl_step(sched_cfg.name)):
        return int(total_steps * ratio)
    if ratio:
        return math.ceil(ratio * total_steps)
    return int(sched_cfg.warmup_steps)


def build_scheduler(optimizer, sched_cfg, total_steps: int, per_step: int = 1):
    """The schedule ``optim.scheduler.name`` over ``total_steps`` optimiser steps, ``per_step`` of them per RL step:
    an entry of :data:`SCHEDULES`, or ``transformers.get_scheduler`` with :func:`warmup_steps`."""
    if sched_cfg.name in SCHEDULES:
        return SCHEDULES.get(sched_cfg.name)(optimizer, sched_cfg, total_steps, per_step)
    from transformers import get_scheduler

    extra = dict(sched_cfg.kwargs)
    return get_scheduler(sched_cfg.name, optimizer, num_warmup_steps=warmup_steps(sched_cfg, total_steps),
                         num_training_steps=total_steps, scheduler_specific_kwargs=extra or None)


def lr_factors(sched_cfg, total_steps: int, per_step: int, count: int) -> list[float]:
    """The schedule's lr factor (lr / ``optim.optimizer.lr``) at each of its first ``count`` optimiser steps, from the
    schedule itself (:func:`build_scheduler`) on a throwaway optimiser."""
    import torch

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched, out = build_scheduler(opt, sched_cfg, total_steps, per_step), []
    for _ in range(count):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


def _takes_no_extras(name: str, sched_cfg) -> list[str]:
    """A schedule of :data:`SCHEDULES` takes no ``kwargs`` and ignores Open-Instruct's warmup rule: refuse both."""
    out = []
    if sched_cfg.kwargs:
        out.append(f"optim.scheduler.kwargs={dict(sched_cfg.kwargs)}: optim.scheduler.name={name} takes none "
                   f"(expected {{}})")
    if sched_cfg.warmup_override_bug:
        out.append(f"optim.scheduler.warmup_override_bug=true: Open-Instruct's warmup rule, not "
                   f"optim.scheduler.name={name}'s (expected false)")
    return out


@SCHEDULES.register("verl_constant", check=_takes_no_extras, per_rl_step=True)
def verl_constant(optimizer, sched_cfg, total_steps: int, per_step: int):
    """veRL 0.2's actor (and critic) schedule, as SimpleRL-Zoo's fork runs it: ``get_constant_schedule_with_warmup``
    (verl/utils/torch_functional.py, veRL 0.2.0.post2 lines 455-464) is a ``LambdaLR`` of ``min(1, s / max(1,
    warmup))``, and the worker steps it once per ``update_actor`` (verl/workers/fsdp_workers.py line 434), after the
    RL step's ``update_policy`` has taken all its optimiser steps. So every optimiser step of RL step ``s`` (from 0)
    runs at ``lr x min(1, s / max(1, warmup))``: with warmup 0 the whole first RL step at lr 0 (AdamW still updates
    its moments), the full lr from the second. Warmup in RL steps: ``int(warmup_ratio x RL steps)`` (fsdp_workers.py
    lines 272-274, ``total_training_steps`` = RL steps: ray_trainer.py), else ``optim.scheduler.warmup_steps``.
    The engines step a schedule per optimiser step, so the lambda reads optimiser step ``k`` as RL step ``k //
    per_step``; its state is the optimiser step count, saved and restored with the engine's."""
    from torch.optim.lr_scheduler import LambdaLR

    warmup = warmup_steps(sched_cfg, total_steps // per_step)
    return LambdaLR(optimizer, partial(_verl_constant_factor, per_step=per_step, warmup=warmup))


def _verl_constant_factor(k: int, *, per_step: int, warmup: int) -> float:
    """Optimiser step ``k``'s factor: veRL's ``lr_lambda`` at its RL step ``k // per_step``."""
    return min(1.0, float(k // per_step) / float(max(1, warmup)))


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
