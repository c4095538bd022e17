"""The comparison of a fidelity check (tests/fidelity/compare.py) on synthetic records: identical steps pass, a
difference beyond fp32 rounding in any compared quantity fails by name, and a step that moved nothing is vacuous."""
from __future__ import annotations

import copy

import torch

from tests.fidelity.compare import diffs, failures, rm_diffs, vacuous
from tests.fidelity.compare_engine import engine_failures, engine_rm_diffs


def _record(seed: int = 0) -> tuple[list[dict], dict]:
    g = torch.Generator().manual_seed(seed)
    init = {"w": torch.randn(4, 3, generator=g) * 0.05}
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # [N=2, R=3]
    adv = torch.tensor([[0.7, 0.7, 0.0], [-0.7, -0.7, -0.7]])  # [N, R] masked
    step = {"prompt_length": 2, "input_ids": torch.tensor([[5, 6, 7, 8, 0], [5, 6, 9, 9, 1]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]), "mask": mask, "advantages": adv,
            "micro": [{"rows": torch.tensor([0, 1]), "logprobs": -torch.rand(2, 3, generator=g), "loss": 0.25}],
            "grad_norm": [0.5], "lr": [1e-5], "weights": {"w": init["w"] + 1e-5}}
    return [step], init


def _theirs(ours: list[dict]) -> list[dict]:
    s = ours[0]
    return [{"prompt_ids": s["input_ids"][:, :2].clone(), "completion_mask": s["mask"].clone(),
             "advantages": s["advantages"][:, 0].clone(), "micro": copy.deepcopy(s["micro"]),
             "grad_norm": list(s["grad_norm"]), "lr": list(s["lr"]),
             "weights": {k: v.clone() for k, v in s["weights"].items()}}]


def test_identical_steps_pass_and_are_not_vacuous():
    ours, init = _record()
    per_step = diffs(ours, _theirs(ours), init)
    assert failures(per_step) == [] and vacuous(per_step, ours) == []
    assert per_step[0]["update"] > 0


def test_each_quantity_beyond_rounding_fails_by_name():
    ours, init = _record()
    cases = {"advantages": lambda t: t["advantages"].add_(1e-3),
             "grad_norm": lambda t: t["grad_norm"].__setitem__(0, 0.6),
             "lr": lambda t: t["lr"].__setitem__(0, 2e-5), "loss": lambda t: t["micro"][0].__setitem__("loss", 0.3),
             "logprobs": lambda t: t["micro"][0]["logprobs"].sub_(1e-3),
             "weights": lambda t: t["weights"]["w"].add_(5e-6), "prompt_ids": lambda t: t["prompt_ids"].add_(1),
             "completion_mask": lambda t: t["completion_mask"].zero_()}
    for name, change in cases.items():
        theirs = _theirs(ours)
        change(theirs[0])
        assert [line.split()[2] for line in failures(diffs(ours, theirs, init))] == [name], name


def test_a_step_that_moved_nothing_is_vacuous():
    ours, init = _record()
    ours[0]["weights"] = {k: v.clone() for k, v in init.items()}
    ours[0]["advantages"] = torch.zeros_like(ours[0]["advantages"])
    theirs = _theirs(ours)
    assert vacuous(diffs(ours, theirs, init), ours) == ["no step changed the weights", "every advantage is 0"]


def _rm_record() -> tuple[dict, dict]:
    """One reward-model optimiser step (tests/fidelity/ours_rm.py's layout) and the source's identical record."""
    g = torch.Generator().manual_seed(1)
    init = {"w": torch.randn(3, 2, generator=g) * 0.05}
    pairs = [{"chosen": [5, 6, 1], "rejected": [5, 7, 1]}, {"chosen": [8, 1], "rejected": [9, 9, 1]}]
    batch = {"input_ids": torch.tensor([[0, 5, 6, 1], [0, 0, 8, 1], [0, 5, 7, 1], [0, 9, 9, 1]]),
             "attention_mask": torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]])}
    step = {"order": [0, 1], "micro": [{**batch, "rewards": torch.tensor([0.2, 0.1, 0.15, 0.3]), "loss": 0.7}],
            "grad_norm": [0.4], "lr": [9e-6], "weights": {"w": init["w"] + 9e-6}}
    ours = {"init": init, "pairs": pairs, "steps": [step]}
    return ours, copy.deepcopy({"pairs": pairs, "steps": [step]})


def test_identical_rm_steps_pass_and_a_token_or_reward_difference_fails_by_name():
    ours, theirs = _rm_record()
    per_step = rm_diffs(ours, theirs)
    assert failures(per_step) == [] and vacuous(per_step, ours["steps"]) == [] and per_step[0]["update"] > 0
    cases = {"ids": lambda t: t["pairs"][1]["rejected"].__setitem__(0, 4),
             "rewards": lambda t: t["steps"][0]["micro"][0]["rewards"].add_(1e-3),
             "grad_norm": lambda t: t["steps"][0]["grad_norm"].__setitem__(0, 0.6),
             "weights": lambda t: t["steps"][0]["weights"]["w"].add_(5e-6)}
    for name, change in cases.items():
        ours, theirs = _rm_record()
        change(theirs)
        assert [line.split()[2] for line in failures(rm_diffs(ours, theirs))] == [name], name
    ours, theirs = _rm_record()
    theirs["steps"][0]["micro"][0]["attention_mask"] = theirs["steps"][0]["micro"][0]["attention_mask"][:, 1:]
    assert rm_diffs(ours, theirs)[0]["ids"] == float("inf")  # another padded length


def test_weights_lose_one_rounding_per_optimiser_step_before_the_update_bound():
    # a weight of 1.0 after an update of 1e-8: one float32 step of it (1.19e-7) is 12 updates, which the old bound
    # (1e-2 of the update) failed; n optimiser steps allow n roundings, and anything past them still fails
    ours, init = _record()
    init = {"w": torch.ones(4, 3)}
    ours[0]["weights"] = {"w": init["w"] + 1e-8 * torch.arange(1, 13.0).view(4, 3)}
    theirs = _theirs(ours)
    one_ulp = torch.nextafter(ours[0]["weights"]["w"], torch.full((4, 3), 2.0))
    theirs[0]["weights"]["w"] = one_ulp
    assert failures(diffs(ours, theirs, init)) == []  # one optimiser step: one rounding allowed
    theirs[0]["weights"]["w"] = torch.nextafter(one_ulp, torch.full((4, 3), 2.0))  # two roundings
    assert [line.split()[2] for line in failures(diffs(ours, theirs, init))] == ["weights"]


def test_a_critic_is_compared_by_its_loss_gradient_and_weights():
    ours, init = _record()
    critic = {"v": torch.randn(2, 3) * 0.05}
    ours[0].update(value_grad_norm=[0.3], value_weights={"v": critic["v"] + 1e-5})
    ours[0]["micro"][0]["value_loss"] = 0.05
    theirs = _theirs(ours)
    theirs[0].update(value_grad_norm=[0.3], value_weights={"v": ours[0]["value_weights"]["v"].clone()})
    theirs[0]["micro"][0]["value_loss"] = 0.05
    per_step = diffs(ours, theirs, init, critic)
    assert failures(per_step) == [] and per_step[0]["value_update"] > 0
    cases = {"value_loss": lambda t: t["micro"][0].__setitem__("value_loss", 0.06),
             "value_grad_norm": lambda t: t["value_grad_norm"].__setitem__(0, 0.4),
             "value_weights": lambda t: t["value_weights"]["v"].add_(5e-6)}
    for name, change in cases.items():
        theirs = _theirs(ours)
        theirs[0].update(value_grad_norm=[0.3], value_weights={"v": ours[0]["value_weights"]["v"].clone()})
        theirs[0]["micro"][0]["value_loss"] = 0.05
        change(theirs[0])
        assert [line.split()[2] for line in failures(diffs(ours, theirs, init, critic))] == [name], name


def test_an_engine_check_holds_bf16_figures_to_units_of_bf16():
    # rewards one bf16 unit apart pass (each side's are bf16 values), three fail; so does a master-weight change that
    # differs by a fifth of itself
    ours, theirs = _rm_record()
    ours["steps"][0]["weights"] = {"w": ours["init"]["w"] + 1e-6 * torch.ones(3, 2)}
    theirs["steps"][0]["weights"] = {"w": ours["steps"][0]["weights"]["w"].clone()}
    one_unit = 2.0 ** -7 * 0.3  # the largest reward is 0.3
    theirs["steps"][0]["micro"][0]["rewards"] = theirs["steps"][0]["micro"][0]["rewards"] + one_unit
    assert engine_failures(engine_rm_diffs(ours, theirs)) == []
    theirs["steps"][0]["micro"][0]["rewards"] += 2 * one_unit
    assert [line.split()[2] for line in engine_failures(engine_rm_diffs(ours, theirs))] == ["rewards"]
    theirs["steps"][0]["micro"][0]["rewards"] -= 3 * one_unit
    theirs["steps"][0]["weights"]["w"] += 2e-7
    assert [line.split()[2] for line in engine_failures(engine_rm_diffs(ours, theirs))] == ["weights_l2"]
