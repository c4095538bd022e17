"""The derive step of the config pipeline (core/config/pipeline.py ``prepare``): every figure of a run that follows
from its checked config, as frozen typed records. The loops, ``recipes.explain``, ``core.launch`` and
``recipes.probe`` read this one object instead of redoing the arithmetic.

- RL (recipes/rl.py, conf/train/grpo.yaml): a step samples ``prompts_per_step x group_size`` completions; each of the
  ``world_size`` learner ranks takes an equal contiguous slice of them (TRL 1.16 ``process_slice``); an optimiser
  step takes ``mini_batch_size`` completions, each rank its share accumulated from ``grad_accum`` micro-batches of
  ``micro_batch_size``; ``ppo_epochs`` passes over the step's mini-batches.
- RM (recipes/rm.py, conf/train/rm.yaml): an optimiser step takes ``batch_size`` pairs, each rank its share in
  ``grad_accum`` micro-batches of ``micro_batch_size`` pairs.

Steps that depend on the data are ``None`` until it is read: ``plan.for_rows(n)`` returns the plan for ``n``
training rows (RL ``train.epochs``: drop-last passes over them; RM: ``epochs`` passes, capped by ``max_steps``).
The division itself was checked before (core/config/validate.py ``BATCH_SPLITS``), so the sizes here are whole.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from omegaconf import OmegaConf

from core.config.layout import engines, tensor_parallel
from core.config.scale import command_line_keys
from core.config.validate import refuse
from core.config.warm_start import decide
from core.registry import Registry


@dataclass(frozen=True, kw_only=True)
class Layout:
    """The GPUs of the run (``layout``, core/config/layout.py): learners train, rollout GPUs only generate (a
    dedicated layout), ``engines`` vLLM engines of ``tp`` GPUs each."""

    mode: str
    nodes: int
    gpus_per_node: int
    learner_gpus: int
    rollout_gpus: int
    engines: int
    tp: int


@dataclass(frozen=True, kw_only=True)
class Model:
    """One model the loop builds: its ``role`` (policy, reference, critic, reward_model), where its weights come
    from (``model.name_or_path``, the critic's ``init_from``, or ``tiny``: built in the process from ``model.tiny``),
    whether it trains, its dtype, ZeRO stage and what DeepSpeed keeps in CPU memory."""

    role: str
    source: str
    trainable: bool
    dtype: str
    zero_stage: int
    offload_params: bool
    offload_optimizer: bool


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """``optim.scheduler``: its name and the three keys its warmup follows from (core/training/optim.py
    ``warmup_steps`` reads them by these names)."""

    name: str
    warmup_ratio: float
    warmup_steps: int
    warmup_override_bug: bool

    @property
    def per_rl_step(self) -> bool:
        """One value per RL step, its warmup in RL steps (veRL's ``verl_constant``), not per optimiser step."""
        from core.training.optim import per_rl_step

        return per_rl_step(self.name)

    def warmup(self, total: int) -> int:
        """Warmup steps of a schedule over ``total`` of its steps (optimiser or RL steps: :attr:`per_rl_step`)."""
        from core.training.optim import warmup_steps

        return warmup_steps(self, total)


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    """What every loop's plan holds: the learner ranks, the layout, the models, the schedule, the training rows
    (None until read) and the steps of the run (None until the rows decide them). Each loop's plan adds its batch
    hierarchy, its ``optimizer_steps_per_step`` and ``for_rows``."""

    # (config key, plan attribute): values config.yaml records from the plan (core/config/pipeline.py ``recorded``)
    RECORDED: ClassVar[tuple[tuple[str, str], ...]] = ()

    world_size: int
    layout: Layout
    models: tuple[Model, ...]
    schedule: Schedule
    rows: int | None = None
    total_steps: int | None

    @property
    def total_optimizer_steps(self) -> int | None:
        return None if self.total_steps is None else self.total_steps * self.optimizer_steps_per_step

    @property
    def warmup(self) -> int | None:
        """Warmup steps of the schedule over the run, in its own steps (optimiser steps, or RL steps for a schedule
        :attr:`Schedule.per_rl_step`); None until the run's steps are known."""
        total = self.total_steps if self.schedule.per_rl_step else self.total_optimizer_steps
        return None if total is None else self.schedule.warmup(total)

    def model(self, role: str) -> Model | None:
        return next((m for m in self.models if m.role == role), None)


@dataclass(frozen=True, kw_only=True)
class RLPlan(RunPlan):
    """One RL step's batch hierarchy, per step and per learner rank, and the run's steps."""

    RECORDED: ClassVar[tuple[tuple[str, str], ...]] = (("train.total_steps", "total_steps"),
                                                       ("train.warm_start.enabled", "warm_start"))

    prompts_per_step: int
    group_size: int
    samples_per_step: int
    samples_per_rank: int
    mini_batch_size: int
    mini_batches: int  # per pass over the step's completions
    mini_batch_per_rank: int
    micro_batch_size: int
    grad_accum: int
    ppo_epochs: int
    optimizer_steps_per_rl_step: int
    logprob_micro_batch_size: int
    # the loss reads the sampler's per-token log-probs (an importance correction: loss.is_correction.mode), so the
    # rollout asks the engine for them; nothing else reads them, and vLLM's costs a Python object per token
    rollout_logprobs: bool
    epochs: int | None
    warm_start: bool  # the supervised warm start runs before RL (train.warm_start.enabled resolved)
    warm_start_why: str  # why it runs or not, in the config's keys (core/config/warm_start.py)

    @property
    def optimizer_steps_per_step(self) -> int:
        return self.optimizer_steps_per_rl_step

    def rows_problem(self, rows: int) -> str | None:
        """Why a step cannot draw its prompts from ``rows`` training rows, or None."""
        if self.prompts_per_step > rows:
            return (f"train.prompts_per_step={self.prompts_per_step} is larger than the training set ({rows} rows "
                    f"after filtering)")
        return None

    def for_rows(self, rows: int) -> RLPlan:
        """The plan for ``rows`` training rows (after the filters): ``train.epochs`` drop-last passes of
        ``rows // prompts_per_step`` steps (veRL's ``drop_last`` dataloader, :class:`core.data.prompts.PromptSampler`),
        else ``train.total_steps``. Raises :class:`core.config.validate.ConfigError` when a step needs more prompts than
        there are rows."""
        problem = self.rows_problem(rows)
        if problem:
            refuse([problem])
        steps = self.total_steps if self.epochs is None else self.epochs * (rows // self.prompts_per_step)
        return dataclasses.replace(self, rows=rows, total_steps=steps)


@dataclass(frozen=True, kw_only=True)
class RMPlan(RunPlan):
    """A reward-model step's pairs, per step and per learner rank, and the run's optimiser steps."""

    batch_size: int
    pairs_per_rank: int
    micro_batch_size: int
    grad_accum: int
    epochs: int
    max_steps: int | None

    optimizer_steps_per_step: ClassVar[int] = 1

    def for_rows(self, rows: int) -> RMPlan:
        """The plan for ``rows`` usable training pairs: ``epochs x (rows // batch_size)`` steps (both sources floor
        ``len(data) // batch_size``), capped by ``max_steps``. Raises :class:`core.data.prompts.DataError` when
        that is no step."""
        from core.data.prompts import DataError

        steps = self.epochs * (rows // self.batch_size)
        if self.max_steps:
            steps = min(steps, self.max_steps)
        if steps < 1:
            raise DataError(f"data: {rows} usable training pairs make no optimiser step of "
                            f"train.batch_size={self.batch_size} pairs")
        return dataclasses.replace(self, rows=rows, total_steps=steps)


# ``loop`` -> fn(checked cfg) -> its plan
PLANS: Registry = Registry("run plan")


@PLANS.register("rl")
def rl_plan(cfg) -> RLPlan:
    t, world = cfg.train, cfg.layout.learner_gpus
    samples = t.prompts_per_step * t.group_size
    mini_batches = samples // t.mini_batch_size
    warm = decide(t.warm_start, command_line_keys())
    return RLPlan(**_common(cfg, _rl_models(cfg)), total_steps=t.total_steps, epochs=t.epochs,
                  prompts_per_step=t.prompts_per_step, group_size=t.group_size, samples_per_step=samples,
                  samples_per_rank=samples // world, mini_batch_size=t.mini_batch_size, mini_batches=mini_batches,
                  mini_batch_per_rank=t.mini_batch_size // world, micro_batch_size=t.micro_batch_size,
                  grad_accum=t.mini_batch_size // (t.micro_batch_size * world), ppo_epochs=t.ppo_epochs,
                  optimizer_steps_per_rl_step=mini_batches * t.ppo_epochs,
                  logprob_micro_batch_size=t.logprob_micro_batch_size,
                  rollout_logprobs=cfg.loss.is_correction.mode != "none", warm_start=warm.runs,
                  warm_start_why=warm.why)


@PLANS.register("rm")
def rm_plan(cfg) -> RMPlan:
    t, world = cfg.train, cfg.layout.learner_gpus
    model = _model(cfg, "reward_model", _source(cfg.model.name_or_path), trainable=True)
    return RMPlan(**_common(cfg, (model,)), total_steps=None, batch_size=t.batch_size,
                  pairs_per_rank=t.batch_size // world, micro_batch_size=t.micro_batch_size,
                  grad_accum=t.batch_size // (t.micro_batch_size * world), epochs=t.epochs, max_steps=t.max_steps)


def _common(cfg, models: tuple[Model, ...]) -> dict:
    lay, sched = cfg.layout, cfg.optim.scheduler
    layout = Layout(mode=lay.mode, nodes=lay.nodes, gpus_per_node=lay.gpus_per_node, learner_gpus=lay.learner_gpus,
                    rollout_gpus=lay.rollout_gpus, engines=engines(cfg), tp=tensor_parallel(cfg))
    schedule = Schedule(name=sched.name, warmup_ratio=sched.warmup_ratio, warmup_steps=sched.warmup_steps,
                        warmup_override_bug=sched.warmup_override_bug)
    return {"world_size": lay.learner_gpus, "layout": layout, "models": models, "schedule": schedule}


def needs_reference(kl) -> bool:
    """``kl.reference``: auto builds the reference iff beta > 0 (OpenRLHF, TRL skip it at 0)."""
    return kl.coef > 0 if kl.reference == "auto" else bool(kl.reference)


def _rl_models(cfg) -> tuple[Model, ...]:
    """The policy; the frozen reference when the KL needs one; the critic of an estimator with values, from its
    ``init_from`` checkpoint (a reward model) or the policy's weights (recipes/rl_models.py ``load_models``)."""
    policy = _source(cfg.model.name_or_path)
    models = [_model(cfg, "policy", policy, trainable=True)]
    if needs_reference(cfg.kl):
        models.append(_model(cfg, "reference", policy, trainable=False))
    critic = OmegaConf.select(cfg, "advantage.critic")
    if critic is not None:
        models.append(_model(cfg, "critic", critic.init_from or policy, trainable=True))
    return tuple(models)


def _source(name_or_path: str | None) -> str:
    return name_or_path or "tiny"


def _model(cfg, role: str, source: str, trainable: bool) -> Model:
    """``role``'s model under ``zero``: the frozen reference's partitions offloaded as :func:`offloads_reference`
    says (the backend places them so: core/training/backend.py), the trained models' as ``zero.offload_param`` does."""
    zero = cfg.zero
    offload = bool(zero.offload_param) if trainable else offloads_reference(zero)
    return Model(role=role, source=source, trainable=trainable, dtype=cfg.model.dtype, zero_stage=zero.stage,
                 offload_params=offload, offload_optimizer=trainable and bool(zero.offload_optimizer))


def offloads_reference(zero_cfg) -> bool:
    """The reference's partitions live in CPU memory: ``zero.offload_reference`` (OpenRLHF's
    ``--ref_reward_offload``), or ``zero.offload_param``, which puts every model's there (TRL's
    ``prepare_deepspeed`` gives the reference the policy's DeepSpeed config)."""
    return bool(zero_cfg.offload_reference or zero_cfg.offload_param)
