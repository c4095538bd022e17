"""The backend of a run, built once from ``(zero, device, dtype)``: it loads the models where they belong, builds the
optimiser engines (:mod:`core.training.engine`) and the frozen reference, and is the one place that reads
``zero.stage``.

A stage means two facts here (:data:`STAGES`): which engine trains (plain torch at 0, DeepSpeed at 1-3) and whether
parameters are partitioned over the ranks (3). Everything ZeRO-3 does differently follows from
:attr:`Backend.partitioned`, and the loops never look at the stage:

- loading (:meth:`Backend.placed`): ``from_pretrained`` under transformers' ``HfDeepSpeedConfig``, so
  ``deepspeed.zero.Init`` partitions each weight as it loads and no rank holds a full copy (a 70B model is ~140 GB
  in bf16); the reference under a placement of its own (:func:`offloads_reference`);
- changing loaded weights in place (:meth:`Backend.writable`: a fresh head's initialisation, a LoRA merge): gathered,
  and rank 0's values partitioned back;
- the reference policy (:meth:`Backend.frozen`): sharded by a DeepSpeed engine without optimiser, as TRL's
  ``prepare_deepspeed`` and OpenRLHF's reference model do; whole on the device otherwise;
- the train engine (:meth:`Backend.train_engine`) is told ``partitioned``, which decides its ``gathered`` (the policy
  whole around generation), its weight-push walk (``named_full_parameters``, each parameter gathered alone) and
  ``save_pretrained`` (a consolidated state dict).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from core.config.plan import offloads_reference
from core.training.engine import DeepSpeedEngine, TorchEngine, TrainEngine, deepspeed_distributed

if TYPE_CHECKING:
    import deepspeed


@dataclass(frozen=True)
class Stage:
    """What one ``zero.stage`` means to the code."""

    deepspeed: bool  # a DeepSpeedEngine trains (ZeRO shards optimiser state, gradients, ...); else a TorchEngine
    partitioned: bool  # the parameters too are partitioned over the ranks (ZeRO-3)


STAGES = {0: Stage(deepspeed=False, partitioned=False), 1: Stage(deepspeed=True, partitioned=False),
          2: Stage(deepspeed=True, partitioned=False), 3: Stage(deepspeed=True, partitioned=True)}


@dataclass
class FrozenModel:
    """A model that is only evaluated (the reference policy): eval mode, no gradients, built by :meth:`Backend.frozen`.
    ``module`` is called like any model; under ZeRO-3 (``engine``: DeepSpeed's, without optimiser, which holds the
    partitioning hooks) each layer is gathered as it runs, so every rank must run the same number of forwards
    (equal row counts per rank give that)."""

    module: torch.nn.Module
    engine: deepspeed.DeepSpeedEngine | None = None


class Backend:
    """Placement and engines of one run: ``zero`` (the ``zero`` config group), the rank's ``device`` and the models'
    ``dtype`` (``core.training.device``: both resolved before any model is built)."""

    def __init__(self, zero_cfg, device: torch.device, dtype: torch.dtype):
        if zero_cfg.stage not in STAGES:
            raise ValueError(f"zero.stage={zero_cfg.stage!r}: expected one of {sorted(STAGES)}")
        self.zero, self.device, self.dtype = zero_cfg, device, dtype
        self.stage = STAGES[zero_cfg.stage]

    @property
    def partitioned(self) -> bool:
        return self.stage.partitioned

    @contextlib.contextmanager
    def placed(self, reference: bool = False):
        """Build models inside this. Under ZeRO-3 it is transformers' ``HfDeepSpeedConfig`` route: ``from_pretrained``
        runs under ``deepspeed.zero.Init``, which partitions each weight as it loads. Elsewhere it does nothing.

        zero.Init places each partition once, where its config says (``offload_param``), and DeepSpeed never moves a
        partitioned parameter again: a later ``deepspeed.initialize`` with ``offload_param`` leaves it where it is
        (partition_parameters.py ``_partition_param`` allocates ``ds_tensor`` only when it is None). So the reference
        policy is built in a context of its own (``reference``), placed by :func:`offloads_reference`."""
        if not self.partitioned:
            yield
            return
        from transformers.integrations import HfDeepSpeedConfig
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        deepspeed_distributed()
        offload = offloads_reference(self.zero) if reference else bool(self.zero.offload_param)
        keep = HfDeepSpeedConfig({"zero_optimization": zero3_section(self.zero, offload),
                                  "bf16": {"enabled": self.dtype == torch.bfloat16},
                                  "train_micro_batch_size_per_gpu": 1})  # noqa: F841 (transformers holds a weakref)
        try:
            yield
        finally:
            unset_hf_deepspeed_config()  # later calls (generate, save) see no global DeepSpeed config

    def train_engine(self, model, optim_cfg, total_steps: int, grad_accum: int, micro_batch: int,
                     per_step: int = 1) -> TrainEngine:
        """The optimiser engine of ``model``: :class:`TorchEngine` on the device, or :class:`DeepSpeedEngine` (which
        places the model on its accelerator's device, the rank's GPU or the CPU); its schedule over ``total_steps``
        optimiser steps, ``per_step`` of them per RL step (core/training/optim.py ``build_scheduler``)."""
        if not self.stage.deepspeed:
            return TorchEngine(model, optim_cfg, total_steps, grad_accum, self.device, per_step)
        return DeepSpeedEngine(model, optim_cfg, total_steps, grad_accum, self.zero, micro_batch, self.partitioned,
                               per_step)

    def frozen(self, model) -> FrozenModel:
        """``model`` as the reference policy. Partitioned: a DeepSpeed engine without optimiser shards it (TRL's
        ``prepare_deepspeed``; build it inside ``placed(reference=True)``, which placed its partitions). Otherwise each
        rank holds it whole on the device, as TRL does under ZeRO-1/2 (they shard optimiser state and gradients, which
        a frozen model has none of)."""
        for p in model.parameters():
            p.requires_grad_(False)
        if not self.partitioned:
            return FrozenModel(model.to(self.device).eval())
        import deepspeed

        deepspeed_distributed()
        bf16 = any(p.dtype == torch.bfloat16 for p in model.parameters())
        engine, *_ = deepspeed.initialize(model=model, config={
            "zero_optimization": zero3_section(self.zero, offloads_reference(self.zero)),
            "bf16": {"enabled": bf16}, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 10**9})
        return FrozenModel(engine.module.eval(), engine)

    def writable(self, params) -> contextlib.AbstractContextManager[Any]:
        """A context in which ``params`` (of a model built here) may be modified in place (a fresh head's
        initialisation, a LoRA merge): partitioned, they are gathered and rank 0's values are partitioned back on
        exit; otherwise nothing happens."""
        if not self.partitioned:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(params), modifier_rank=0)


def zero3_section(zero_cfg, offload: bool) -> dict:
    """The ``zero_optimization`` section of a ZeRO-3 model: ``zero.options`` and, with ``offload``, parameter
    partitions in (pinned) CPU memory."""
    zero = {"stage": 3, **dict(zero_cfg.options)}
    if offload:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero
