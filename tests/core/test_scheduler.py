"""The learning-rate schedule's warmup (core/training/optim.py ``warmup_steps``, ``build_scheduler``), with and without
Open-Instruct's release warmup rule (``optim.scheduler.warmup_override_bug``); veRL's ``verl_constant``, one lr per RL
step, through the engine and across a resume."""
from __future__ import annotations

import json

import pytest
import torch

from core.config import schema
from core.training.engine import TorchEngine
from core.training.optim import SCHEDULES, build_scheduler, lr_factors, scheduler_names, warmup_steps

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


def _lrs(sched_cfg, rl_steps: int, per_step: int) -> list[float]:
    """The lr of each optimiser step of ``rl_steps`` RL steps of ``per_step`` optimiser steps each, through the engine
    (its step reports the lr it stepped with), at optim lr 1; and the weights after each RL step."""
    torch.manual_seed(0)
    optim = schema.node(schema.OptimConfig, {"optimizer": {"lr": 1.0, "weight_decay": 0.1}, "max_grad_norm": 0.0,
                                             "scheduler": sched_cfg})
    engine = TorchEngine(torch.nn.Linear(3, 1), optim, rl_steps * per_step, 1, torch.device("cpu"), per_step)
    lrs, weights = [], []
    for _ in range(rl_steps):
        for _ in range(per_step):
            engine.backward(engine.forward(lambda m, x: m(x).square().sum(), torch.ones(2, 3)))
            lrs.append(engine.step()["lr"])
        weights.append(engine.module.weight.detach().clone())
    return lrs, weights


# warmup_ratio, warmup_steps, RL steps, optimiser steps per RL step -> each optimiser step's lr, by hand from veRL's
# lr_lambda min(1, s / max(1, warmup)) at RL step s (verl/utils/torch_functional.py), stepped once per RL step
VERL_CASES = [
    (0.0, 0, 3, 4, [0.0] * 4 + [1.0] * 8),  # SimpleRL-Zoo: warmup 0, the whole first RL step at lr 0
    (0.0, 3, 5, 2, [0.0, 0.0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0]),  # 3 RL steps of warmup
    (0.25, 0, 4, 3, [0.0] * 3 + [1.0] * 9),  # veRL's int(0.25 x 4 RL steps) = 1
    (0.25, 0, 10, 1, [0.0, 0.5] + [1.0] * 8),  # int(2.5) = 2 (the HF Trainer's ceil would give 3)
]


@pytest.mark.parametrize("ratio,steps,rl_steps,per_step,expected", VERL_CASES)
def test_verl_constant_takes_one_lr_per_rl_step(ratio, steps, rl_steps, per_step, expected):
    sched = {"name": "verl_constant", "warmup_ratio": ratio, "warmup_steps": steps}
    lrs, _ = _lrs(sched, rl_steps, per_step)
    assert lrs == pytest.approx(expected, abs=1e-12)
    assert lr_factors(schema.node(schema.SchedulerConfig, **sched), rl_steps * per_step, per_step,
                      len(expected)) == pytest.approx(expected, abs=1e-12)


def test_at_lr_0_the_first_rl_step_leaves_the_weights_and_constant_does_not():
    """AdamW at lr 0 moves nothing, weight decay included (decoupled: lr x decay); the HF constant schedule moves the
    weights from the first step."""
    torch.manual_seed(0)
    start = torch.nn.Linear(3, 1).weight.detach().clone()  # _lrs builds the same layer after the same seed
    _, verl = _lrs({"name": "verl_constant"}, 2, 3)
    _, const = _lrs({"name": "constant"}, 2, 3)
    assert torch.equal(verl[0], start) and not torch.equal(verl[1], start)
    assert not torch.equal(const[0], start)


def test_verl_constant_refuses_kwargs_and_the_open_instruct_rule():
    cfg = schema.node(schema.SchedulerConfig, name="verl_constant", kwargs={"min_lr_rate": 0.1},
                      warmup_override_bug=True)
    assert SCHEDULES.problems("verl_constant", cfg) == [
        "optim.scheduler.kwargs={'min_lr_rate': 0.1}: optim.scheduler.name=verl_constant takes none (expected {})",
        "optim.scheduler.warmup_override_bug=true: Open-Instruct's warmup rule, not "
        "optim.scheduler.name=verl_constant's (expected false)"]
    assert "verl_constant" in scheduler_names() and "constant_with_warmup" in scheduler_names()


# the tiny recipe with 2 optimiser steps per RL step and veRL's schedule over 2 RL steps of warmup: 4 RL steps at
# lr x 0, 0.5, 1, 1; a checkpoint every 2
RESUMED = ("scale=tiny", "recipe_name=tiny_math_grpo", "train.warm_start.steps=0", "logger.progress=false",
           "logger.tensorboard=false", "train.eval_prompts=4", "train.eval_every=0", "train.total_steps=4",
           "train.mini_batch_size=8", "train.micro_batch_size=8", "optim.scheduler.name=verl_constant",
           "optim.scheduler.warmup_steps=2", "train.checkpoint_every=2", "optim.optimizer.lr=1e-4")


def _step_lrs(run_dir) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["lr"]) for r in rows if "lr" in r]


def test_a_resumed_run_continues_verl_constant_where_it_stopped(tmp_path, monkeypatch):
    """A run killed after its step-2 checkpoint and resumed trains steps 3 and 4 at the uninterrupted run's lrs: the
    schedule's state (its optimiser step count) is restored with the engine, not restarted at lr 0."""
    from core.config.pipeline import prepare
    from recipes import rl

    def run(name: str, *more: str) -> None:  # typed keys stay the user's under scale=tiny, as on the command line
        rl.main(prepare([*RESUMED, f"paths.results_dir={tmp_path}", *more]), run_dir=str(tmp_path / name))

    run("whole")
    whole, lr = _step_lrs(tmp_path / "whole"), 1e-4  # optim.optimizer.lr above
    assert [s for s, _ in whole] == [1, 2, 3, 4]
    assert [v for _, v in whole] == pytest.approx([0.0, 0.5 * lr, lr, lr], rel=1e-12)
    step, calls = rl.rl_step, []

    def killed_in_step_3(r):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return step(r)

    monkeypatch.setattr(rl, "rl_step", killed_in_step_3)
    with pytest.raises(KeyboardInterrupt):
        run("cut")
    monkeypatch.setattr(rl, "rl_step", step)
    run("cut", "resume=true")
    assert _step_lrs(tmp_path / "cut") == whole
