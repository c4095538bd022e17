"""An engine check's comparison (tests/fidelity/compare_engine.py) on synthetic records: bf16 figures held to units
of bf16's last place, per rank, and a step at lr 0 held to no change at all."""
from __future__ import annotations

import copy

import torch

from tests.fidelity.compare import vacuous
from tests.fidelity.compare_engine import BF16_ULP, engine_failures, engine_rl_diffs, engine_rm_diffs
from tests.fidelity.test_compare import _record, _rm_record, _theirs


def _engine_rl() -> tuple[dict, dict]:
    """Two ranks' records of one RL step (each rank's own rows) and the source's identical ones; the fp32 master
    weights after the step on rank 0's record."""
    ranks = []
    for seed in (0, 1):
        steps, init = _record(seed)
        ranks.append(steps)
    init = {"w": torch.full((4, 3), 0.05)}
    weights = {"w": init["w"] + 1e-6 * torch.arange(12.0).view(4, 3)}
    ours = {"init": init, "ranks": ranks, "steps": [{**ranks[0][0], "weights": weights}]}
    theirs = {"ranks": [_theirs(r) for r in ranks], "steps": [{"weights": copy.deepcopy(weights)}]}
    return ours, theirs


def test_identical_engine_rl_steps_pass_and_each_quantity_beyond_bf16_fails_by_name():
    ours, theirs = _engine_rl()
    per_step = engine_rl_diffs(ours, theirs)
    assert engine_failures(per_step) == [] and vacuous(per_step, ours["steps"]) == []
    scale = float(ours["ranks"][1][0]["micro"][0]["logprobs"].abs().max())
    cases = {  # each on rank 1 only: the figure is the largest over the ranks
        "logprobs": lambda t: t["ranks"][1][0]["micro"][0]["logprobs"].sub_(3 * BF16_ULP * scale),
        "advantages": lambda t: t["ranks"][1][0]["advantages"].add_(1e-3),
        "loss": lambda t: t["ranks"][1][0]["micro"][0].__setitem__("loss", 0.25 * (1 + 4 * BF16_ULP)),
        "grad_norm": lambda t: t["ranks"][1][0]["grad_norm"].__setitem__(0, 0.5 * (1 + 5 * BF16_ULP)),
        "lr": lambda t: t["ranks"][1][0]["lr"].__setitem__(0, 2e-5),
        "prompt_ids": lambda t: t["ranks"][1][0]["prompt_ids"].add_(1),
        "weights_l2": lambda t: t["steps"][0]["weights"]["w"].add_(1e-6)}
    for name, change in cases.items():
        ours, theirs = _engine_rl()
        change(theirs)
        assert [line.split()[2] for line in engine_failures(engine_rl_diffs(ours, theirs))] == [name], name
    ours, theirs = _engine_rl()  # one bf16 unit of the log-prob scale is a last rounding: it passes
    theirs["ranks"][1][0]["micro"][0]["logprobs"].sub_(BF16_ULP * scale)
    assert engine_failures(engine_rl_diffs(ours, theirs)) == []


def test_a_step_at_lr_0_must_leave_the_master_weights_exactly_where_they_were():
    # the recipes' first step runs at lr 0 (their warmup): our change is 0, so any difference of the source's is a
    # step it took and we did not (the relative figure was 0 / 0 before: nan, which failed identical records)
    ours, theirs = _rm_record()
    ours["steps"][0]["weights"] = {k: v.clone() for k, v in ours["init"].items()}
    theirs["steps"][0]["weights"] = {k: v.clone() for k, v in ours["init"].items()}
    assert engine_rm_diffs(ours, theirs)[0]["weights_l2"] == 0.0
    assert engine_failures(engine_rm_diffs(ours, theirs)) == []
    theirs["steps"][0]["weights"]["w"][0, 0] += 1e-6
    assert [line.split()[2] for line in engine_failures(engine_rm_diffs(ours, theirs))] == ["weights_l2"]
