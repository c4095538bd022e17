"""``memory/peak_mb`` is each step's peak (core/reporting/metrics.py), not the process's since it started, and the
largest over ranks (core/training/distributed.py ``mean_metrics``), not rank 0's."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.reporting import metrics
from core.training import distributed


def _step(alloc_mb: int) -> dict[str, float]:
    metrics.reset_peak_memory()
    if alloc_mb:
        x = torch.ones(alloc_mb * 2**20 // 4)  # every page written, so resident
        del x
    return metrics.peak_memory()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="per-step CPU peak needs Linux /proc")
def test_a_step_without_the_large_tensor_reports_a_lower_peak():
    first, second = _step(512), _step(0)
    assert first["memory/peak_mb"] - second["memory/peak_mb"] > 400, (first, second)


def test_a_cpu_peak_that_cannot_be_reset_is_named_since_start(monkeypatch, tmp_path):
    monkeypatch.setattr(metrics, "_CLEAR_REFS", tmp_path / "missing" / "clear_refs")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    metrics.reset_peak_memory()
    assert list(metrics.peak_memory()) == ["memory/peak_since_start_mb"]


def _rank(rank: int, init: str, out: str) -> None:
    """One of 2 gloo ranks: a step's per-rank figures, rank 1 with the larger peak (a rank-0 figure would miss it)."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    peak = {"memory/peak_mb": 100.0 + 200 * rank}
    got = [distributed.mean_metrics({"time/update": 1.0 + rank, "loss": 2.0 * rank}, peak),
           distributed.mean_metrics({"time/update": 1.0 + rank})]
    torch.save(got, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.distributed
def test_the_logged_peak_is_the_largest_over_ranks_and_the_rest_their_mean(tmp_path):
    """What the loops log of a step on 2 ranks (recipes/rl.py, recipes/rm.py): the timers and losses averaged, the
    peak memory the maximum, every rank getting the same figures from one collective."""
    mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", str(tmp_path / "out")), nprocs=2, join=True)
    for rank in range(2):
        assert torch.load(tmp_path / f"out.{rank}") == [{"time/update": 1.5, "loss": 1.0, "memory/peak_mb": 300.0},
                                                        {"time/update": 1.5}]


def test_a_rewind_keeps_the_records_it_cuts_aside(tmp_path):
    """A resume cuts the records back to its checkpoint (here: 2 of 5 steps; a killed attempt without a checkpoint:
    all of them); metrics.jsonl then holds each step once, and what was cut is in superseded/, not lost (issue 37)."""
    import json

    writer = metrics.MetricsWriter(tmp_path, tensorboard=False)
    for step in range(1, 6):
        writer.log(step, {"reward/mean": float(step)})
    writer.rewind(2)
    (tmp_path / "metrics.jsonl").open("a").write('{"step": 6, "rew')  # a kill mid-write: a partial line
    writer.rewind(2)
    kept = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    aside = [json.loads(line) for line in (tmp_path / "superseded" / "metrics.jsonl").read_text().splitlines()]
    assert kept == [1, 2] and writer.rows == 2
    assert [r.get("step") for r in aside] == [3, 4, 5, None] and aside[3]["unparsed"] == '{"step": 6, "rew'
    assert all(r["superseded_at"] > 0 for r in aside)
