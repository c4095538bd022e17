"""Compare our recorded RL or reward-model steps with a source framework's (``ours.pt`` and ``<source>.pt``,
tests/fidelity/ours_rl.py, ours_rm.py) and state the largest difference of each quantity, with the tolerance it is held
to (docs/fidelity.md).

Tolerances are fp32 rounding of the same computation done in another order (another transformers release's
attention and MLP code, another reduction order): per-token log-probs and advantages of magnitude up to ~10 agree to
1e-5 absolute; the loss, a mean of those, to 1e-5; the gradient norm to 1e-4 relative; the weights after a step to
1e-2 of that step's largest update beyond the weight's own rounding (below); a reward model's token ids exactly and its
rewards (about 0.2 at init) to 1e-5. The update, about lr per element under AdamW, is where the rounding enters:
``w + update`` of a weight of 0.04 rounds to a neighbouring float 3.7e-9 away, 4e-3 of a 1e-6 update (the distill
recipe's lr) but 1.2e-2 of a 3e-7 one (Open-Instruct's 8B lr), and each optimiser step rounds again. So each element's
difference first loses ``n x eps x |w|`` (n: the optimiser steps so far, one fp32 rounding of the weight each; eps
1.19e-7), and what is left is held to 1e-2 of the update. A real difference (lr, schedule, gradient scale, clipping)
changes the update by a large fraction of itself; an element whose gradient were rounding noise on both sides could
move by up to lr either way and fail this bound too: that would show, not hide.
"""
from __future__ import annotations

import torch

TOL = {"prompt_ids": 0.0, "completion_mask": 0.0, "advantages": 1e-5, "logprobs": 1e-5, "loss": 1e-5,
       "grad_norm": 1e-4, "lr": 1e-12, "weights": 1e-2, "ids": 0.0, "rewards": 1e-5,
       "value_loss": 1e-5, "value_grad_norm": 1e-4, "value_weights": 1e-2}


def _max(x: torch.Tensor) -> float:
    return float(x.abs().max()) if x.numel() else 0.0


def _layout(ours: dict, theirs: dict) -> dict[str, float]:
    """Differing prompt ids and completion-mask entries (counts), where the source made its own."""
    out = {}
    if "prompt_ids" in theirs:
        P, their_ids = ours["prompt_length"], theirs["prompt_ids"]
        keep = ours["attention_mask"][:, :P]  # [N, P] where the prompt's tokens are (padding left out)
        out["prompt_ids"] = (float(((ours["input_ids"][:, :P] - their_ids) * keep != 0).sum())
                             if their_ids.shape == keep.shape else float("inf"))
    if "completion_mask" in theirs:
        R = min(ours["mask"].shape[1], theirs["completion_mask"].shape[1])
        out["completion_mask"] = float((ours["mask"][:, :R].long() != theirs["completion_mask"][:, :R].long()).sum())
    return out


def step_diffs(ours: dict, theirs: dict, start: dict, n: int) -> dict[str, float]:
    """Largest difference per quantity for one RL step; ``start`` is the policy before it (for the update's size), ``n``
    the optimiser steps up to its end.
    Prompt ids and the completion mask are compared where the source built its own (TRL tokenises and masks)."""
    mask = ours["mask"].bool()  # [N, R]
    adv = theirs["advantages"] if theirs["advantages"].dim() == 2 else theirs["advantages"][:, None]  # [N, R|1]
    out = {**_layout(ours, theirs), "advantages": _max((ours["advantages"] - adv[:, :mask.shape[1]])[mask])}
    lp, loss, vloss = [], [], []
    for a, b in zip(ours["micro"], theirs["micro"], strict=True):
        m = mask[a["rows"]][:, :b["logprobs"].shape[1]]  # [n, R]
        lp.append(_max((a["logprobs"][:, :m.shape[1]] - b["logprobs"])[m]))
        loss.append(abs(a["loss"] - b["loss"]))
        if "value_loss" in b:  # a critic (Open-Instruct PPO): its micro-batch loss, the coefficient in
            vloss.append(abs(a["value_loss"] - b["value_loss"]))
    out.update(logprobs=max(lp), loss=max(loss), **({"value_loss": max(vloss)} if vloss else {}))
    return {**out, **_optimiser(ours, theirs, start, n), **_critic(ours, theirs, start, n)}


def _beyond_rounding(a: torch.Tensor, b: torch.Tensor, n: int) -> float:
    """Largest ``|a - b|`` of two weight tensors less ``n`` fp32 roundings of the weight (n optimiser steps)."""
    slack = n * torch.finfo(torch.float32).eps * torch.maximum(a.abs(), b.abs())
    return _max(((a - b).abs() - slack).clamp(min=0))


def _optimiser(ours: dict, theirs: dict, start: dict, n: int) -> dict[str, float]:
    """The optimiser steps' gradient norms (relative) and lr, and the weights after the step beyond ``n`` roundings
    (:func:`_beyond_rounding`) as a fraction of the step's largest update (``update``, kept: a zero one would make
    the check vacuous)."""
    out = {"grad_norm": max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["grad_norm"], theirs["grad_norm"],
                                                                           strict=True)),
           "lr": max(abs(a - b) for a, b in zip(ours["lr"], theirs["lr"], strict=True))}
    keys = [k for k in start if k != "critic"]
    update = max(_max(ours["weights"][k] - start[k]) for k in keys)
    diff = max(_beyond_rounding(ours["weights"][k], theirs["weights"][k], n) for k in keys)
    return {**out, "weights": diff / update if update else diff, "update": update}


def _critic(ours: dict, theirs: dict, start: dict, n: int) -> dict[str, float]:
    """With a critic on both sides: its gradient norms (relative) and its weights after the step as a fraction of the
    step's largest critic update (``start["critic"]``: the critic before the step)."""
    if "value_weights" not in theirs:
        return {}
    grad = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["value_grad_norm"], theirs["value_grad_norm"],
                                                               strict=True))
    before, after = start["critic"], ours["value_weights"]
    update = max(_max(after[k] - before[k]) for k in before)
    diff = max(_beyond_rounding(after[k], theirs["value_weights"][k], n) for k in before)
    return {"value_grad_norm": grad, "value_weights": diff / update if update else diff, "value_update": update}


def _differing(a: torch.Tensor, b: torch.Tensor) -> float:
    """Entries of two integer tensors that differ (inf when their shapes do)."""
    return float((a != b.to(a.dtype)).sum()) if a.shape == b.shape else float("inf")


def rm_step_diffs(ours: dict, theirs: dict, pairs: tuple[list, list], start: dict, n: int) -> dict[str, float]:
    """Largest difference per quantity for one reward-model optimiser step (tests/fidelity/ours_rm.py): ``ids``
    counts the differing token ids of the step's pairs (``pairs``: ours and theirs, tokenized) and of its padded
    micro-batches (ids and attention mask); then the rewards ``[2B]`` and loss of each micro-batch, and
    :func:`_optimiser`'s figures."""
    ids = sum(_differing(torch.tensor(pairs[0][i][side]), torch.tensor(pairs[1][i][side]))
              for i in ours["order"] for side in ("chosen", "rejected"))
    rewards, loss = [], []
    for a, b in zip(ours["micro"], theirs["micro"], strict=True):
        ids += _differing(a["input_ids"], b["input_ids"]) + _differing(a["attention_mask"], b["attention_mask"])
        rewards.append(_max(a["rewards"] - b["rewards"]))
        loss.append(abs(a["loss"] - b["loss"]))
    return {"ids": ids, "rewards": max(rewards), "loss": max(loss), **_optimiser(ours, theirs, start, n)}


def rm_diffs(ours: dict, theirs: dict) -> list[dict[str, float]]:
    """:func:`rm_step_diffs` of every recorded optimiser step of ``ours.pt`` and ``openrlhf.pt`` (whole records)."""
    if len(ours["steps"]) != len(theirs["steps"]):
        raise AssertionError(f"{len(ours['steps'])} steps recorded on our side, {len(theirs['steps'])} on the source's")
    starts = [ours["init"]] + [s["weights"] for s in ours["steps"][:-1]]
    pairs = (ours["pairs"], theirs["pairs"])
    return [rm_step_diffs(a, b, pairs, s, i + 1)
            for i, (a, b, s) in enumerate(zip(ours["steps"], theirs["steps"], starts))]


def diffs(ours: list[dict], theirs: list[dict], init: dict, critic: dict | None = None) -> list[dict[str, float]]:
    """:func:`step_diffs` of every recorded step (their counts must agree); ``critic``: the critic before the first
    step, where there is one."""
    if len(ours) != len(theirs):
        raise AssertionError(f"{len(ours)} steps recorded on our side, {len(theirs)} on the source's")
    starts = [init] + [s["weights"] for s in ours[:-1]]
    if critic is not None:
        critics = [critic] + [s["value_weights"] for s in ours[:-1]]
        starts = [{**s, "critic": c} for s, c in zip(starts, critics)]
    done = [sum(len(s["grad_norm"]) for s in ours[:i + 1]) for i in range(len(ours))]  # optimiser steps so far
    return [step_diffs(a, b, s, n) for a, b, s, n in zip(ours, theirs, starts, done)]


def failures(per_step: list[dict[str, float]]) -> list[str]:
    """Each quantity of each step beyond its tolerance, as a line."""
    return [f"step {i + 1}: {k} differs by {v:.3g} (tolerance {TOL[k]:g})"
            for i, d in enumerate(per_step) for k, v in d.items() if k in TOL and not v <= TOL[k]]


def vacuous(per_step: list[dict[str, float]], ours: list[dict]) -> list[str]:
    """Why a comparison could pass without testing anything: no weight moved, no gradient, no advantage."""
    out = [] if max(d["update"] for d in per_step) > 0 else ["no step changed the weights"]
    out += [] if max(max(s["grad_norm"]) for s in ours) > 0 else ["every gradient norm is 0"]
    if "advantages" not in ours[0]:  # a reward-model step has none
        return out
    return out + ([] if any(float(s["advantages"].abs().max()) > 0 for s in ours) else ["every advantage is 0"])


def main(argv: list[str]) -> None:
    """``python -m tests.fidelity.compare DIR PACKAGE``: the per-step differences of ``DIR/ours.pt`` and
    ``DIR/PACKAGE.pt`` (a check's drivers run by hand, docs/fidelity.md), and what fails."""
    from pathlib import Path

    from safetensors.torch import load_file

    if len(argv) != 2:
        raise SystemExit(main.__doc__)
    out = Path(argv[0])
    ours, theirs = (torch.load(out / f"{name}.pt", weights_only=False) for name in ("ours", argv[1]))
    if "pairs" in ours:  # a reward-model record (tests/fidelity/ours_rm.py)
        per_step = rm_diffs(ours, theirs)
    else:
        critic = out / "init_critic" / "model.safetensors"
        per_step = diffs(ours["steps"], theirs["steps"], load_file(out / "init" / "model.safetensors"),
                         load_file(critic) if critic.exists() else None)
    ours = ours["steps"]
    for i, d in enumerate(per_step):
        print(f"step {i + 1}: " + ", ".join(f"{k} {v:.3g}" for k, v in d.items()))
    print("\n".join(failures(per_step) + vacuous(per_step, ours)) or "within tolerance")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])

