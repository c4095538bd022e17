"""core/planning/traffic.py: what the probe counts beside FLOPs (ops, the memory traffic of the ops that are not matrix
products or attention, the module passes ZeRO-3 hooks), on ops whose counts are known, then on a probed model."""
from __future__ import annotations

import functools

import torch

from core.planning.traffic import Traffic
from recipes.probe import probe, total_flop_counter


def _count(fn):
    with Traffic(total_flop_counter().flop_registry) as t:
        fn()
    return t


def test_matrix_products_launch_but_move_nothing_counted_here():
    """A matmul's FLOPs are the counter's; its launch is an op. An elementwise op reads its inputs and writes its
    output: 2 x 4 x 1000 bytes in, 4 x 1000 out. A view moves nothing and launches nothing."""
    a, b = torch.ones(10, 100), torch.ones(100, 10)
    t = _count(lambda: a @ b)
    assert (t.ops, t.bytes) == (1, 0)
    x, y = torch.ones(1000), torch.ones(1000)
    t = _count(lambda: (x.view(10, 100), x * y))
    assert (t.ops, t.bytes) == (1, 3 * 4000)


def test_an_embedding_moves_the_rows_it_picks_not_the_table():
    table, ids = torch.ones(50_000, 64), torch.zeros(8, dtype=torch.long)
    t = _count(lambda: torch.nn.functional.embedding(ids, table))
    assert t.bytes == 2 * 8 * 64 * 4 + 8 * 8


@functools.cache
def _rm_update(max_len: int, checkpointing: bool) -> dict:
    return probe(["recipe=tiny_rm", "train.micro_batch_size=2", f"train.max_len={max_len}",
                  f"model.gradient_checkpointing={str(checkpointing).lower()}"])["phases"]["rm_update"]


def test_module_passes_count_forward_backward_and_recompute():
    """The tiny reward model (2 Llama layers of 9 parameter-owning modules; embedding, final norm, score head): each
    module's forward and backward, and under checkpointing the layers' forwards once more (DeepSpeed ZeRO-3 gathers a
    module at each)."""
    plain, recomputed = _rm_update(64, False), _rm_update(64, True)
    assert plain["module_passes"] == 2 * (2 * 9 + 3)
    assert recomputed["module_passes"] == 3 * 2 * 9 + 2 * 3
    assert recomputed["ops"] > plain["ops"] > 0


def test_traffic_grows_with_the_tokens_and_ops_do_not():
    short, long = _rm_update(64, False), _rm_update(128, False)
    assert 1.8 < long["traffic_bytes"] / short["traffic_bytes"] < 2.1
    assert long["ops"] == short["ops"]
