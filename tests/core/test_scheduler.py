"""The learning-rate schedule's warmup (core/training/engine.py ``warmup_steps``, ``build_scheduler``), with and without
Open-Instruct's release warmup rule (``optim.scheduler.warmup_override_bug``)."""
from __future__ import annotations

import pytest
import torch

from core.config import schema
from core.training.optim import build_scheduler, warmup_steps

# warmup_ratio, warmup_steps, bug, optimiser steps -> warmup
CASES = [
    (0.0, 5, False, 8, 5),  # no ratio: the steps
    (0.0, 5, True, 8, 0),  # release: `warmup_ratio >= 0.0` always holds, int(8 x 0.0) = 0 replaces the 5 steps
    (0.1, 0, False, 8, 1),  # ceil(0.8)
    (0.1, 0, True, 8, 0),  # int(0.8)
    (0.1, 7, True, 2500, 250),  # the 70B run: int(2,500 x 0.1)
    (0.1, 7, False, 2500, 250),
]


@pytest.mark.parametrize("ratio,steps,bug,total,expected", CASES)
def test_warmup_steps(ratio, steps, bug, total, expected):
    cfg = schema.node(schema.SchedulerConfig, name="linear", warmup_ratio=ratio, warmup_steps=steps,
                      warmup_override_bug=bug)
    assert warmup_steps(cfg, total) == expected


def test_the_release_rule_starts_at_the_full_rate_when_only_warmup_steps_is_set():
    """--warm_up_steps 5 on the release: no warmup at all, the linear decay starts from the full learning rate."""
    rates = {}
    for bug in (False, True):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        cfg = schema.node(schema.SchedulerConfig, name="linear", warmup_steps=5, warmup_override_bug=bug)
        sched = build_scheduler(opt, cfg, 10)
        rates[bug] = [sched.get_last_lr()[0]]
        for _ in range(3):
            opt.step()
            sched.step()
            rates[bug].append(sched.get_last_lr()[0])
    assert rates[False] == pytest.approx([0.0, 0.2, 0.4, 0.6])  # warming up over 5 steps
    assert rates[True] == pytest.approx([1.0, 0.9, 0.8, 0.7])  # linear decay over 10 steps from the first
