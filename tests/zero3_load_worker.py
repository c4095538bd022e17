"""Worker for tests/test_zero.py: build a tiny policy, reference and critic under ZeRO-3 on this rank.

Run as ``DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/zero3_load_worker.py MODEL_DIR OUT [OFFLOAD]``;
rank 0 writes what each model holds locally, where DeepSpeed placed the reference's partitions and the
reference's log-probs of a fixed batch to OUT. OFFLOAD ``1``: ``zero.offload_reference=true``.
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
from core.training.backend import Backend  # noqa: E402

MODEL = schema.node(schema.ModelConfig, {"dtype": "float32", "attn_implementation": "sdpa"})
# threshold 0: no parameter of the tiny model stays whole on every rank (DeepSpeed keeps those under 1e5
# elements unpartitioned by default, which would be all of them)
def zero3(offload_reference: bool):
    return schema.node(schema.ZeroConfig, {"stage": 3, "offload_reference": offload_reference,
                                           "options": {"stage3_param_persistence_threshold": 0}})


def placed_by(param):
    """The ``zero.Init`` that partitioned ``param`` (its ``partition`` closure holds it): its ``remote_device``
    is where the partition was allocated, and DeepSpeed keeps no other per-parameter record of that."""
    from deepspeed.runtime.zero.partition_parameters import Init

    return next(c.cell_contents for c in param.partition.__closure__ if isinstance(c.cell_contents, Init))


def placement(model, frozen) -> dict:
    """Where the reference's partitions live, by DeepSpeed's own state: the remote device of the zero.Init
    that allocated them (the offload config's device name, ``"cpu"``, when offloaded; the rank's ``torch.device``
    otherwise, which on CPU is also cpu, hence the type) and the offload device of its engine's parameter coordinator."""
    inits = {placed_by(p) for p in model.parameters()}
    return {"remote": sorted({f"{type(i.remote_device).__name__}:{i.remote_device}" for i in inits}),
            "engine_offload": str(frozen.engine.optimizer.offload_device)}


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (4, 12), generator=g)
    am = torch.ones_like(ids)
    am[0, :2] = 0  # left padding
    am[1, 10:] = 0  # right padding after an EOS
    return ids, am


def main(model_dir: str, out: str, offload: bool) -> None:
    distributed.init(torch.device("cpu"))
    backend = Backend(zero3(offload), torch.device("cpu"), torch.float32)
    with backend.placed(reference=True):  # as recipes/rl.py builds it
        ref = load_causal_lm(model_dir, MODEL)
    with backend.placed():
        critic = load_critic(model_dir, schema.node(schema.CriticConfig, head_seed=3), MODEL, backend.writable)
    params = list(ref.parameters())
    held = {"partitioned": all(hasattr(p, "ds_id") for p in params),
            "local": sum(p.ds_tensor.numel() for p in params), "full": sum(p.ds_numel for p in params)}
    frozen = backend.frozen(ref)
    held["placement"] = placement(ref, frozen)
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
    main(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "1")
