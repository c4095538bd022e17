"""The optimiser engines the loops talk to: plain torch (``zero.stage: 0``) or DeepSpeed ZeRO 1/2/3.

Both expose the same calls, so a loop never branches on the backend:

- ``engine.forward(fn, *args)``: a training forward, ``fn(model, *args)``. It runs inside the wrapper's
  own forward (DDP's or DeepSpeed's), which both need: DDP arms its gradient all-reduce there, and
  ZeRO-3 gave wrong gradients with accumulation when the bare module was called (tests/test_zero.py);
- ``engine.module``: the underlying model, for generation, no-grad forwards, saving and attributes;
- ``engine.backward(loss)``: once per micro-batch; ``loss`` must already carry its share of the
  optimiser step's normaliser (the aggregation divides by accumulation steps or token counts), so
  no backend rescales it again;
- ``engine.step() -> {"grad_norm", "lr"}``: once per optimiser step, after exactly ``grad_accum``
  micro-batches (clip, step, schedule, zero);
- ``engine.gathered(enabled)``: a context in which ``engine.module`` holds its full parameters on every rank,
  for generation (ZeRO-3 partitions them; TRL's ``unwrap_model_for_generation`` does the same);
- ``engine.named_full_parameters()``: ``(name, full tensor)`` of every parameter, tied ones once, for a
  weight push (vLLM); under ZeRO-3 each is gathered alone while the caller holds it (collective: every rank
  walks them all, in the same order);
- ``engine.save_state(dir)/load_state(dir)`` and ``engine.save_pretrained(dir)`` for checkpoints
  (collective: every rank calls them; rank 0 writes what is not sharded).

The plain engine is DDP under data parallelism (bucketed all-reduce overlapped with backward, synced on
the last micro-batch of each optimiser step only, as ``no_sync`` does) and keeps fp32 master weights
for a bf16 model (:class:`MasterWeights`), as DeepSpeed's bf16 mode does: bf16 forward, backward and
gradient accumulation, fp32 optimiser step. Which engine a run gets, and whether its parameters are
partitioned (ZeRO-3), is decided once, by :class:`core.training.backend.Backend`, which builds the engines
and also loads the models and the frozen reference.

DeepSpeed runs on CPU too (``DS_ACCELERATOR=cpu torchrun ...`` over gloo), which is how its path is
tested here.
"""
from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import torch

from core.training import distributed
from core.training.optim import build_optimizer, build_scheduler, cpu_adam, retune


class _Call(torch.nn.Module):
    """The module DDP and DeepSpeed wrap: its forward runs any ``fn(inner, ...)``, so every training forward
    (a causal-LM log-prob pass, a reward head on the backbone) goes through the wrapper's forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, fn, *args, **kwargs):
        return fn(self.inner, *args, **kwargs)


class MasterWeights:
    """fp32 copies of low-precision trainable parameters for the optimiser (DeepSpeed's bf16 mode on the
    plain engine): the optimiser steps the copies from the gradients cast to fp32, and the parameters
    take the rounded result, so updates far below a bf16 ulp (learning rates of 1e-7) still accumulate."""

    def __init__(self, params: list[torch.nn.Parameter]):
        self.params = params
        self.master = [torch.nn.Parameter(p.detach().float().clone()) for p in params]

    def take_grads(self) -> None:
        """The parameters' gradients, in fp32, onto the copies (and off the parameters)."""
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        for p, m in zip(self.params, self.master):
            p.copy_(m)

    def state_dict(self) -> list[torch.Tensor]:
        return [m.detach() for m in self.master]

    @torch.no_grad()
    def load_state_dict(self, tensors: list[torch.Tensor]) -> None:
        for m, t in zip(self.master, tensors):
            m.copy_(t)
        self.write_back()


class TorchEngine:
    """Plain torch on one device: the reference path every other backend must agree with. Under data
    parallelism the model is wrapped in DDP, which averages gradients over ranks during backward."""

    def __init__(self, model, optim_cfg, total_steps: int, grad_accum: int, device: torch.device, per_step: int = 1):
        from torch.nn.parallel import DistributedDataParallel

        self.module = model.to(device)
        self.grad_accum, self._micro = grad_accum, 0
        params = [p for p in model.parameters() if p.requires_grad]
        self.master = MasterWeights(params) if any(p.dtype != torch.float32 for p in params) else None
        self._stepped = self.master.master if self.master else params  # what the optimiser updates
        self.optimizer = build_optimizer(self._stepped, optim_cfg)
        self.scheduler = build_scheduler(self.optimizer, optim_cfg.scheduler, total_steps, per_step)
        self.max_grad_norm = float(optim_cfg.max_grad_norm)
        self._call = _Call(model)
        self._ddp = None
        if distributed.world() > 1:  # broadcasts rank 0's weights, then all-reduces gradients in backward
            ids = [device.index] if device.type == "cuda" else None
            self._ddp = DistributedDataParallel(self._call, device_ids=ids, broadcast_buffers=False)

    def forward(self, fn, *args, **kwargs):
        if self._ddp is None:
            return self._call(fn, *args, **kwargs)
        # all-reduce only with the step's last micro-batch (DDP's no_sync for the others)
        self._ddp.require_backward_grad_sync = self._micro + 1 == self.grad_accum
        return self._ddp(fn, *args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self._micro += 1

    def gathered(self, enabled: bool = True):
        return contextlib.nullcontext()

    def named_full_parameters(self):
        for name, param in self.module.named_parameters():
            yield name, param.detach()

    def step(self) -> dict[str, float]:
        if self._micro != self.grad_accum:
            raise RuntimeError(f"step() after {self._micro} micro-batches; the engine was built for "
                               f"{self.grad_accum}")
        self._micro = 0
        if self.master is not None:
            self.master.take_grads()
        norm = _clip(self._stepped, self.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        if math.isfinite(norm):  # a NaN or inf gradient never reaches the weights (veRL dp_actor._optimizer_step),
            self.optimizer.step()  # and the schedule waits with them, as DeepSpeed's overflow skip does: the loop
            self.scheduler.step()  # then stops or counts the step (core/training/numerics.py)
            if self.master is not None:
                self.master.write_back()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm, "lr": lr}

    def save_state(self, out_dir) -> None:
        """Model, master weights, optimiser and schedule into ``out_dir/engine.pt`` (the caller makes it
        atomic); the ranks hold identical replicas, so rank 0 writes."""
        if distributed.is_main():
            torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "scheduler": self.scheduler.state_dict(),
                        "master": self.master.state_dict() if self.master else None},
                       Path(out_dir) / "engine.pt")

    def state_bytes(self) -> int:
        """The bytes :meth:`save_state` writes: the model's tensors, the master weights and the optimiser's state as
        they are now (each storage once: tied weights share one); the free-space check before a first checkpoint."""
        opt = [v for s in self.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return _storage_bytes([*self.module.state_dict().values(), *(self.master.master if self.master else []), *opt])

    def load_state(self, out_dir) -> None:
        state = torch.load(Path(out_dir) / "engine.pt", weights_only=False, map_location=_device_of(self.module))
        self.module.load_state_dict(state["model"])
        if self.master is not None:
            self.master.load_state_dict(state["master"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def retune(self, optimizer_cfg) -> None:
        retune(self.optimizer, self.scheduler, optimizer_cfg)

    def save_pretrained(self, out_dir, tokenizer=None) -> None:
        if distributed.is_main():
            self.module.save_pretrained(out_dir)
            if tokenizer is not None:
                tokenizer.save_pretrained(out_dir)


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _storage_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors``, each once (``torch.save`` writes a shared storage once)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def _clip(params, max_norm: float) -> float:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def deepspeed_config(zero_cfg, optim_cfg, micro_batch: int, grad_accum: int, bf16: bool) -> dict:
    """The DeepSpeed JSON for ``zero.stage``; clipping is DeepSpeed's so ZeRO sees partitioned grads."""
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * distributed.world(),
        "gradient_clipping": float(optim_cfg.max_grad_norm),
        "zero_allow_untested_optimizer": True,  # a torch AdamW client optimiser
        "zero_optimization": {"stage": int(zero_cfg.stage), **dict(zero_cfg.options)},
        # DeepSpeed's own overflow check skips a step whose gradients are not finite, and train.on_nonfinite=skip
        # relies on it (core/training/numerics.py); written, not left to DeepSpeed's default (true since 0.19.3)
        "bf16": {"enabled": bf16, "check_grad_overflow": True},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    for what in ("offload_optimizer", "offload_param"):
        if zero_cfg[what]:
            cfg["zero_optimization"][what] = {"device": "cpu", "pin_memory": True}
    # Top-level keys, written only when set so null keeps DeepSpeed's own default (the model's dtype):
    # Open-Instruct's get_train_ds_config writes grad_accum_dtype fp32, OpenRLHF's its --ds.grad_accum_dtype.
    if zero_cfg.grad_accum_dtype is not None:
        cfg["data_types"] = {"grad_accum_dtype": zero_cfg.grad_accum_dtype}
    if zero_cfg.communication_data_type is not None:
        cfg["communication_data_type"] = zero_cfg.communication_data_type
    return cfg


# The first DeepSpeed that skips the optimiser step of a non-finite gradient under every ZeRO stage and dtype we train
# in, and reports its norm as inf: 0.19.8 (``is_invalid_grad_norm`` in ``stage_1_and_2.py``, ``stage3.py`` and
# ``bf16_optimizer.py`` ``step``). Before it ZeRO-1/2 checked fp16, and bf16 by default from 0.19.3 (reporting a stale
# norm), never fp32; ZeRO-3 fp16 alone: a NaN step wrote NaN into the fp32 master weights (docs/dependencies.md).
# pyproject.toml's floor is this version; tests/test_floors.py holds them together.
NONFINITE_SKIP_DEEPSPEED = "0.19.8"


def deepspeed_version_problem() -> str | None:
    """Why the installed DeepSpeed cannot train here (older than :data:`NONFINITE_SKIP_DEEPSPEED`), or None. Read
    from the package's metadata, without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        found = version("deepspeed")
    except PackageNotFoundError:
        return "DeepSpeed is not installed here (pip install -e .)"
    if Version(found) >= Version(NONFINITE_SKIP_DEEPSPEED):
        return None
    return (f"DeepSpeed {found} is installed and ZeRO needs deepspeed>={NONFINITE_SKIP_DEEPSPEED} (pyproject.toml): "
            f"older releases step the optimiser on a non-finite gradient under ZeRO-3 and fp32 ZeRO-1/2 (bf16 ZeRO-1/2 "
            f"before 0.19.3), writing NaN into the master weights train.on_nonfinite keeps finite; "
            f"pip install 'deepspeed>={NONFINITE_SKIP_DEEPSPEED},<0.20', or train with zero=none")


def deepspeed_distributed() -> None:
    """DeepSpeed's process group: the one ``core.training.distributed.init`` started under torchrun, or outside a
    launcher (e.g. ``scale=tiny`` in one CPU process) a world of one on an in-memory store
    (``distributed.start_alone``: no TCP port, so runs in one process and jobs on one node never collide; it once was
    ``MASTER_PORT=29500 + pid % 1000``, written into the environment and inherited by every child process).
    DeepSpeed reads ``LOCAL_RANK`` from the environment whatever the group (runtime/engine.py
    ``_do_args_sanity_check``, zero/partition_parameters.py): the device's index, set for the run and removed at its
    end (core/training/lifecycle.py)."""
    import deepspeed
    import torch.distributed as dist

    gpu = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu"
    if not dist.is_initialized():
        distributed.start_alone("nccl" if gpu else "gloo")
    os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device() if gpu else 0))  # torchrun sets it
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo")


class DeepSpeedEngine:
    """DeepSpeed ZeRO behind the :class:`TorchEngine` calls (``zero.stage`` 1, 2 or 3). bf16 when the model
    is (``bf16.enabled``: fp32 master weights in DeepSpeed's optimiser). ``zero.offload_optimizer``: the fp32
    master weights and Adam's moments live in CPU memory and :func:`cpu_adam` steps them there (ZeRO-Offload).
    ``partitioned`` (ZeRO-3, as the backend decided): generation gathers the whole model, saving consolidates it."""

    def __init__(self, model, optim_cfg, total_steps: int, grad_accum: int, zero_cfg, micro_batch: int,
                 partitioned: bool, per_step: int = 1):
        import deepspeed

        problem = deepspeed_version_problem()  # the config check refuses it first (core/config/validate.py)
        if problem:
            raise RuntimeError(problem)
        deepspeed_distributed()
        params = [p for p in model.parameters() if p.requires_grad]
        bf16 = any(p.dtype == torch.bfloat16 for p in model.parameters())
        optimizer = cpu_adam(params, optim_cfg) if zero_cfg.offload_optimizer else build_optimizer(params, optim_cfg)
        scheduler = build_scheduler(optimizer, optim_cfg.scheduler, total_steps, per_step)
        ds_cfg = deepspeed_config(zero_cfg, optim_cfg, micro_batch, grad_accum, bf16)
        self.grad_accum, self._micro, self.partitioned = grad_accum, 0, partitioned
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

    def gathered(self, enabled: bool = True):
        """ZeRO-3: the full parameters on every rank for the duration (collective enter and exit); with
        ``enabled`` false (``rollout.gather_for_generation``) they stay partitioned."""
        if not (self.partitioned and enabled):
            return contextlib.nullcontext()
        return _zero3_gathered(self.engine)

    def named_full_parameters(self):
        """ZeRO-3: each parameter gathered alone and partitioned again before the next (TRL's weight push to
        vLLM), so a rank holds at most one whole parameter beyond its shard; stages 1-2 hold them whole."""
        import deepspeed

        for name, param in self.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):  # a no-op for a parameter ZeRO does not partition
                yield name, param.data

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

    def state_bytes(self) -> int:
        """About the bytes :meth:`save_state` writes over all ranks, counted before the first checkpoint (DeepSpeed's
        files are not measured until written): the module's weights in their dtype, and 12 bytes per trainable
        parameter for the optimiser's fp32 partitions (master weights and Adam's two moments, which ZeRO 1-3 keep in
        fp32 whatever the model's dtype). ZeRO-3 parameters count whole (``ds_numel``)."""
        params = list(self.module.parameters())
        whole = [getattr(p, "ds_numel", p.numel()) for p in params]
        return sum(n * p.element_size() + (12 * n if p.requires_grad else 0) for n, p in zip(whole, params))

    def load_state(self, out_dir) -> None:
        self.engine.load_checkpoint(str(out_dir), tag="engine")

    def retune(self, optimizer_cfg) -> None:
        retune(self.optimizer, self.scheduler, optimizer_cfg)

    def save_pretrained(self, out_dir, tokenizer=None) -> None:
        """Gather (ZeRO-3) and save a plain Hugging Face folder from rank 0."""
        if self.partitioned:
            full = self.engine._zero3_consolidated_16bit_state_dict() or {}  # rank 0 only
            state = {k.removeprefix("inner."): v for k, v in full.items()}
        else:
            state = self.module.state_dict()
        if distributed.is_main():
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


TrainEngine = TorchEngine | DeepSpeedEngine  # what Backend.train_engine builds; both answer the calls above
