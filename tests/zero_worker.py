"""Worker for tests/test_zero.py: train a tiny model through core.zero on this rank's shard.

Run as ``DS_ACCELERATOR=cpu torchrun --nproc_per_node W tests/zero_worker.py STAGE OUT [ZERO_JSON]``; rank 0
writes the final parameters (gathered), the per-step losses and, under DeepSpeed, the data types its engine
read from the config to OUT. ZERO_JSON: more ``zero.*`` keys (e.g. ``{"grad_accum_dtype": "fp32"}``).
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from core.config import schema  # noqa: E402
from core.training.backend import Backend  # noqa: E402

OPTIM = schema.node(schema.OptimConfig, {
    "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-2, "betas": [0.9, 0.999],
                  "eps": 1e-8, "weight_decay": 0.0},
    "max_grad_norm": 1.0, "scheduler": {"name": "linear", "warmup_ratio": 0.0, "warmup_steps": 0, "kwargs": {}}})
STEPS, GLOBAL_BATCH, MICRO = 3, 8, 2


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, GLOBAL_BATCH, 6, generator=g), torch.randn(STEPS, GLOBAL_BATCH, 1, generator=g)


def main(stage: int, out: str, extra: dict) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1 or stage > 0:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    accum = GLOBAL_BATCH // (MICRO * world)
    zero = schema.node(schema.ZeroConfig, extra, stage=stage)
    eng = Backend(zero, torch.device("cpu"), torch.float32).train_engine(model(), OPTIM, STEPS, accum, MICRO)
    xs, ys = data()
    losses, lrs = [], []
    for s in range(STEPS):
        shard_x = xs[s].view(world, -1, 6)[rank]  # this rank's GLOBAL_BATCH / world rows
        shard_y = ys[s].view(world, -1, 1)[rank]
        total = 0.0
        for m in range(accum):
            x, y = shard_x[m * MICRO:(m + 1) * MICRO], shard_y[m * MICRO:(m + 1) * MICRO]
            loss = torch.nn.functional.mse_loss(eng.forward(lambda m, x: m(x), x), y) / accum  # mean over the step
            eng.backward(loss)
            total += loss.item()
        stats = eng.step()
        lrs.append(stats["lr"])
        losses.append(total)
    params = _gathered(eng, stage)
    if rank == 0:
        result = {"losses": losses, "lrs": lrs, "params": params, "grad_norm": stats["grad_norm"]}
        if stage > 0:  # what DeepSpeed parsed from the config it was given (None: the key was absent)
            ds = eng.engine._config
            zero_accum = getattr(eng.engine.optimizer, "gradient_accumulation_dtype", None)  # ZeRO's optimisers
            result["deepspeed"] = {"grad_accum_dtype": ds.grad_accum_dtype,
                                   "communication_data_type": str(ds.communication_data_type),
                                   "zero_grad_accum_dtype": str(zero_accum),
                                   "offload_optimizer": {"device": str(ds.zero_config.offload_optimizer.device),
                                                         "optimizer": type(eng.engine.basic_optimizer).__name__}
                                   if ds.zero_config.offload_optimizer else None}
        json.dump(result, open(out, "w"))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()  # a clean exit: gloo aborts at interpreter shutdown otherwise


def _gathered(eng, stage: int) -> list[float]:
    if stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(eng.module.parameters())):
            return torch.cat([p.detach().flatten() for p in eng.module.parameters()]).tolist()
    return torch.cat([p.detach().flatten() for p in eng.module.parameters()]).tolist()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
