"""The optimiser engine the loops talk to: plain torch (``zero.stage: 0``) or DeepSpeed ZeRO 1/2/3.

Both expose the same calls, so a loop never branches on the backend:

- ``engine.forward(fn, *args)``: a training forward, ``fn(model, *args)``. It runs inside DeepSpeed's
  own forward, which ZeRO-3 needs: calling the bare module (or its backbone and head separately)
  gave wrong gradients under ZeRO-3 with accumulation (tests/test_zero.py);
- ``engine.module``: the underlying model, for generation, saving and attributes;
- ``engine.backward(loss)``: once per micro-batch; ``loss`` must already carry its share of the
  optimiser step's normaliser (the aggregation divides by accumulation steps or token counts), so
  no backend rescales it again;
- ``engine.step() -> {"grad_norm", "lr"}``: once per optimiser step (clip, step, schedule, zero);
- ``engine.gathered()``: a context in which ``engine.module`` holds its full parameters on every
  rank, for generation (ZeRO-3 partitions them; ranks that decode different numbers of tokens must
  not each trigger per-module gathers, TRL's ``unwrap_model_for_generation`` does the same);
- ``engine.save_state(dir)/load_state(dir)`` and ``engine.save_pretrained(dir)`` for checkpoints
  (collective: every rank calls them; rank 0 writes what is not sharded).

Data parallel (``core/distributed.py``): DeepSpeed averages gradients over ranks itself; the torch
engine all-reduces them before clipping, which is what DDP computes (without the overlap).

DeepSpeed runs on CPU too (``DS_ACCELERATOR=cpu torchrun ...`` over gloo), which is how its path is
tested here.
"""
from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import torch
from hydra.utils import instantiate

from core import distributed


def build_scheduler(optimizer, sched_cfg, total_steps: int):
    """``transformers.get_scheduler`` with warmup given as a ratio of ``total_steps`` or in steps."""
    from transformers import get_scheduler

    warmup = int(sched_cfg.get("warmup_steps", 0) or 0)
    if sched_cfg.get("warmup_ratio"):
        warmup = math.ceil(float(sched_cfg.warmup_ratio) * total_steps)
    extra = dict(sched_cfg.get("kwargs") or {})
    return get_scheduler(sched_cfg.name, optimizer, num_warmup_steps=warmup,
                         num_training_steps=total_steps, scheduler_specific_kwargs=extra or None)


def build_optimizer(params, optim_cfg):
    """Instantiate ``optim.optimizer`` (a ``_partial_`` ``_target_`` node) on ``params``."""
    return instantiate(optim_cfg.optimizer)(params)


class TorchEngine:
    """Plain torch: the reference path every other backend must agree with. Under data parallelism
    every rank holds the whole model and gradients are averaged over ranks before clipping."""

    def __init__(self, model, optim_cfg, total_steps: int):
        self.module = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(params, optim_cfg)
        self.scheduler = build_scheduler(self.optimizer, optim_cfg.scheduler, total_steps)
        self.max_grad_norm = float(optim_cfg.get("max_grad_norm", 0) or 0)
        self._params = params

    def forward(self, fn, *args, **kwargs):
        return fn(self.module, *args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def gathered(self):
        return contextlib.nullcontext()

    def step(self) -> dict[str, float]:
        _average_grads(self._params)
        norm = _clip(self._params, self.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm, "lr": lr}

    def save_state(self, out_dir) -> None:
        """Model, optimiser and schedule into ``out_dir/engine.pt`` (the caller makes it atomic); the
        ranks hold identical replicas, so rank 0 writes."""
        if distributed.is_main():
            torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict()}, Path(out_dir) / "engine.pt")

    def load_state(self, out_dir) -> None:
        state = torch.load(Path(out_dir) / "engine.pt", weights_only=False)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def save_pretrained(self, out_dir, tokenizer=None) -> None:
        if distributed.is_main():
            self.module.save_pretrained(out_dir)
            if tokenizer is not None:
                tokenizer.save_pretrained(out_dir)


def _average_grads(params) -> None:
    """Mean of the gradients over data-parallel ranks (what DDP's all-reduce computes)."""
    world = distributed.world()
    if world == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        distributed.all_sum(p.grad).div_(world)


def _clip(params, max_norm: float) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def deepspeed_config(zero_cfg, optim_cfg, micro_batch: int, grad_accum: int, world: int) -> dict:
    """The DeepSpeed JSON for ``zero.stage``; clipping is DeepSpeed's so ZeRO sees partitioned grads."""
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world,
        "gradient_clipping": float(optim_cfg.get("max_grad_norm", 0) or 0),
        "zero_allow_untested_optimizer": True,  # a torch AdamW client optimiser
        "zero_optimization": {"stage": int(zero_cfg.stage), **dict(zero_cfg.get("options") or {})},
        "bf16": {"enabled": bool(zero_cfg.get("bf16", False))},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    for what in ("offload_optimizer", "offload_param"):
        if zero_cfg.get(what):
            cfg["zero_optimization"][what] = {"device": "cpu", "pin_memory": True}
    return cfg


class _Call(torch.nn.Module):
    """The module DeepSpeed wraps: its forward runs any ``fn(inner, ...)``, so every training forward
    (a causal-LM log-prob pass, a reward head on the backbone) goes through DeepSpeed's forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, fn, *args, **kwargs):
        return fn(self.inner, *args, **kwargs)


def _single_process_env() -> None:
    """DeepSpeed outside a launcher (e.g. ``scale=tiny`` in one CPU process): a world of one."""
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


class DeepSpeedEngine:
    """DeepSpeed ZeRO behind the TorchEngine calls (``zero.stage`` 1, 2 or 3)."""

    def __init__(self, model, optim_cfg, total_steps: int, grad_accum: int, zero_cfg, micro_batch: int):
        import deepspeed
        import torch.distributed as dist

        if not dist.is_initialized():
            _single_process_env()
        # idempotent: under torchrun core.distributed.init already started the group, DeepSpeed adopts it
        deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, optim_cfg)
        scheduler = build_scheduler(optimizer, optim_cfg.scheduler, total_steps)
        world = dist.get_world_size() if dist.is_initialized() else 1
        ds_cfg = deepspeed_config(zero_cfg, optim_cfg, micro_batch, grad_accum, world)
        self.grad_accum, self._micro = grad_accum, 0
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=_Call(model), optimizer=optimizer, lr_scheduler=scheduler, config=ds_cfg)

    @property
    def module(self):
        return self.engine.module.inner

    @module.setter
    def module(self, model) -> None:  # e.g. a LoRA model replaced by its merged base before saving
        self.engine.module.inner = model

    def forward(self, fn, *args, **kwargs):
        return self.engine(fn, *args, **kwargs)

    def gathered(self):
        """ZeRO-3: the full parameters on every rank for the duration (collective enter and exit)."""
        if self.engine.zero_optimization_stage() != 3:
            return contextlib.nullcontext()
        return _zero3_gathered(self.engine)

    def backward(self, loss: torch.Tensor) -> None:
        # The loss already carries its accumulation normaliser: stop DeepSpeed dividing by GAS again.
        # DeepSpeed counts the micro-steps itself and steps at the boundary (its documented pattern:
        # backward + step per micro-batch); step() below only checks the count and reports.
        self._micro += 1
        if self._micro == self.grad_accum:  # the rate this optimiser step uses, as TorchEngine reports it
            self._lr = self.scheduler.get_last_lr()[0] if self.scheduler is not None else float("nan")
        self.engine.backward(loss, scale_wrt_gas=False)
        self.engine.step()

    def step(self) -> dict[str, float]:
        if self._micro != self.grad_accum:
            raise RuntimeError(f"step() after {self._micro} micro-batches; the engine was built for {self.grad_accum}")
        self._micro = 0
        norm = self.engine.get_global_grad_norm()
        return {"grad_norm": float(norm) if norm is not None else float("nan"), "lr": self._lr}

    def save_state(self, out_dir) -> None:
        self.engine.save_checkpoint(str(out_dir), tag="engine")

    def load_state(self, out_dir) -> None:
        self.engine.load_checkpoint(str(out_dir), tag="engine")

    def save_pretrained(self, out_dir, tokenizer=None) -> None:
        """Gather (ZeRO-3) and save a plain Hugging Face folder from rank 0."""
        import torch.distributed as dist

        if self.engine.zero_optimization_stage() == 3:
            full = self.engine._zero3_consolidated_16bit_state_dict() or {}  # rank 0 only
            state = {k.removeprefix("inner."): v for k, v in full.items()}
        else:
            state = self.module.state_dict()
        if not dist.is_initialized() or dist.get_rank() == 0:
            self.module.save_pretrained(out_dir, state_dict=state)
            if tokenizer is not None:
                tokenizer.save_pretrained(out_dir)


@contextlib.contextmanager
def _zero3_gathered(engine):
    """Gather every parameter once and take DeepSpeed's per-module hooks off while inside, so forwards
    (generation: as many as each rank's completions need) issue no collectives; then put the hooks
    back with a fresh prefetch trace. TRL ``trl/models/utils.py`` ``remove_hooks`` / ``add_hooks``
    (``unwrap_model_for_generation``) does the same; gathering alone is not enough, the post-forward
    hooks release the parameters again and the next forward all-gathers on one rank only."""
    import deepspeed

    offload = engine.optimizer.parameter_offload
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        for param in offload.module.parameters():
            param.ds_active_sub_modules.clear()
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            coordinator = offload.param_coordinator
            if not coordinator.is_invalid_trace():
                coordinator._invalidate_trace()
            offload._register_deepspeed_module(offload.module)


def build_engine(model, optim_cfg, zero_cfg, total_steps: int, grad_accum: int, micro_batch: int):
    """``TorchEngine`` for ``zero.stage == 0``, else ``DeepSpeedEngine``."""
    if int(zero_cfg.stage) == 0:
        return TorchEngine(model, optim_cfg, total_steps)
    return DeepSpeedEngine(model, optim_cfg, total_steps, grad_accum, zero_cfg, micro_batch)
