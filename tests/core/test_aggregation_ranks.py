"""Aggregations across data-parallel ranks: the modes that promise it give, after the DDP gradient
average over 2 gloo ranks x gradient accumulation, the gradient of one big batch in one process."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.algorithms.loss import AGGREGATIONS, AggContext

WORLD, ACCUM, ROWS, R, H = 2, 2, 8, 5, 3  # 8 rows = 2 ranks x 2 micro-batches x 2 rows


def _batch():
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(ROWS, R, H, generator=g)  # [N, R, H]
    lengths = torch.tensor([5, 0, 3, 2, 4, 5, 1, 2])  # uneven token counts per micro-batch; one row empty
    mask = (torch.arange(R) < lengths.unsqueeze(-1)).float()  # [N, R]
    return feats, mask


def _grad(name: str, rows: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Gradient of the aggregated per-token loss ``tanh(feats @ w)`` over ``rows`` in micro-batches."""
    feats, mask = _batch()
    w = torch.linspace(-1, 1, H, dtype=torch.float64).requires_grad_()
    for micro in rows.view(ctx.num_micro_batches, -1):
        per_token = torch.tanh(feats[micro].double() @ w)  # [n, R]
        AGGREGATIONS.get(name)(per_token, mask[micro].double(), ctx).backward()
    return w.grad


def _worker(rank: int, init: str, out: str) -> None:
    """Rank ``rank`` of the 2: each aggregation's gradient over this rank's shard, averaged over the ranks."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    _, mask = _batch()
    rows = torch.arange(ROWS).view(WORLD, -1)[rank]  # this rank's shard
    tokens = mask[rows].sum()
    dist.all_reduce(tokens)  # the step's tokens over all ranks, as a data-parallel loop must count them
    grads = {}
    for name in AGGREGATIONS.names():
        grad = _grad(name, rows, AggContext(num_micro_batches=ACCUM, step_tokens=float(tokens), world_size=WORLD,
                                            max_tokens=R))
        dist.all_reduce(grad)
        grads[name] = grad / WORLD  # DDP / ZeRO average gradients over ranks
    if rank == 0:
        torch.save(grads, out)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory) -> dict[str, torch.Tensor]:
    """Every aggregation's 2-rank gradient, from one spawn of the 2 ranks (a spawn costs ~4 s of imports)."""
    tmp = tmp_path_factory.mktemp("ranks")
    out = tmp / "grads.pt"
    mp.spawn(_worker, args=(f"file://{tmp / 'store'}", str(out)), nprocs=WORLD, join=True)
    return torch.load(out)


@pytest.mark.distributed
@pytest.mark.parametrize("name", AGGREGATIONS.names())
def test_ranks_and_accumulation_equal_one_batch(name, data_parallel):
    _, mask = _batch()
    one = _grad(name, torch.arange(ROWS), AggContext(num_micro_batches=1, step_tokens=float(mask.sum()),
                                                     max_tokens=R))
    dp = data_parallel[name]
    if AGGREGATIONS.meta(name)["accumulation_exact"]:
        torch.testing.assert_close(dp, one, rtol=1e-12, atol=1e-12)
    else:  # token_mean / _nonempty: each micro-batch divides by its own token / non-empty row count
        assert not torch.allclose(dp, one, rtol=1e-6, atol=1e-9)
    assert len(AGGREGATIONS.names()) == 5
