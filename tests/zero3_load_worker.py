"""Worker for tests/test_zero.py: build a tiny policy, reference and critic under ZeRO-3 on this rank.

Run as ``DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/zero3_load_worker.py MODEL_DIR OUT``; rank 0
writes what each model holds locally and the reference's log-probs of a fixed batch to OUT.
"""
from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from core.config import schema
from core.models.critic import load_critic  # noqa: E402
from core.models.loading import load_causal_lm  # noqa: E402
from core.models.logprobs import chunked_logprobs  # noqa: E402
from core.training import distributed  # noqa: E402
from core.training.engine import FrozenModel, model_init  # noqa: E402

MODEL = schema.node(schema.ModelConfig, {"dtype": "float32", "attn_implementation": "sdpa"})
# threshold 0: no parameter of the tiny model stays whole on every rank (DeepSpeed keeps those under 1e5
# elements unpartitioned by default, which would be all of them)
ZERO3 = schema.node(schema.ZeroConfig, {"stage": 3, "offload_reference": False,
                          "options": {"stage3_param_persistence_threshold": 0}})


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (4, 12), generator=g)
    am = torch.ones_like(ids)
    am[0, :2] = 0  # left padding
    am[1, 10:] = 0  # right padding after an EOS
    return ids, am


def main(model_dir: str, out: str) -> None:
    distributed.init(torch.device("cpu"))
    with model_init(ZERO3, torch.float32):
        ref = load_causal_lm(model_dir, MODEL)
        critic = load_critic(model_dir, schema.node(schema.CriticConfig, head_seed=3), MODEL)
    params = list(ref.parameters())
    held = {"partitioned": all(hasattr(p, "ds_id") for p in params),
            "local": sum(p.ds_tensor.numel() for p in params), "full": sum(p.ds_numel for p in params)}
    frozen = FrozenModel(ref, ZERO3, torch.device("cpu"))
    ids, am = batch()
    lp = chunked_logprobs(frozen.module, ids, am, 6, 1.0, 2, packing=False)
    import deepspeed

    with deepspeed.zero.GatheredParameters([critic.score.weight]):
        head = critic.score.weight.detach().flatten().tolist()
    from core.rollout.hf import _partitioned

    if distributed.is_main():  # partitioned between forwards: generate must step in sync on every rank
        json.dump({**held, "logprobs": lp.tolist(), "head": head, "synced": _partitioned(frozen.module)}, open(out, "w"))
    distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
