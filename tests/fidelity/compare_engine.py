"""Compare an engine check's records (docs/fidelity.md "Engines"): our recipe and its source, each in bf16 with fp32
master weights at its sharding over 2 ranks (``ours.pt`` of tests/fidelity/ours_rl.py or ours_rm.py with
``--engine``, and the source driver's record), with tolerances in units of bf16's last place.

bf16 keeps 8 significant bits: one unit in the last place is 2^-7 of a value's scale. Per step:

- token ids, prompt ids, the completion mask and the lr exactly;
- advantages to 1e-5 absolute (an RL check): both sides compute them in fp32 from the same scores, and bf16 does not
  enter (fp32 rounding of the same computation, as in the fp32 checks);
- each micro-batch's per-token log-probs (RL), rewards (RM) and loss to 2 units of their scale (the largest magnitude
  of that quantity in the micro-batch, for the loss in the rank's step): each side's logits or rewards are bf16
  values, one unit apart where a last rounding differs, one more for a rounding upstream; log-probs and loss are
  fp32 functions of them (or bf16 values: the Open-Instruct RM's loss);
- the gradient norm to 4 units relative (2^-5): a sum of squares of bf16 gradients, reduced over ranks in another
  order and dtype;
- the fp32 master weights: the L2 norm of their difference over that of our change since the start, to 2^-3, and
  exactly equal where neither side changed them (a step at lr 0). That one is not a rounding bound: AdamW's first
  steps move each weight by about lr x sign(g), so a weight whose bf16 gradient rounds near 0 on one side can move
  by up to 2 lr between the two; it was set from the measured 5.4% of the first engine check (open_instruct_rm_8b,
  docs/fidelity.md "Results") with room for the CPU's reduction order, and the three checks added since measure
  under it (0.4% to 5.8%).
"""
from __future__ import annotations

import math

import torch

from tests.fidelity.compare import _layout, _max, rm_step_diffs

BF16_ULP = 2.0 ** -7
ENGINE_TOL = {"ids": 0.0, "prompt_ids": 0.0, "completion_mask": 0.0, "lr": 1e-12, "advantages": 1e-5,
              "logprobs": 2 * BF16_ULP, "rewards": 2 * BF16_ULP, "loss": 2 * BF16_ULP, "grad_norm": 4 * BF16_ULP,
              "weights_l2": 2.0 ** -3}


def relative_l2(ours: dict, theirs: dict, init: dict) -> tuple[float, float]:
    """The L2 norm of ``ours - theirs`` over that of ``ours - init`` (0 when both are 0, inf when only ours is:
    a step that changed nothing on our side must leave the source's weights where they were), and our largest
    change (the check is vacuous if no step has one)."""
    change = torch.cat([(ours[k] - init[k]).flatten() for k in init])
    diff = torch.cat([(ours[k] - theirs[k]).flatten() for k in init])
    c, d = float(change.norm()), float(diff.norm())
    return (d / c if c else (0.0 if d == 0 else math.inf)), float(change.abs().max())


def engine_rm_diffs(ours: dict, theirs: dict) -> list[dict[str, float]]:
    """Per optimiser step of a reward-model engine check, each figure in :data:`ENGINE_TOL`'s units: rewards and loss
    as a fraction of their scale, the gradient norm relative, the master weights as :func:`relative_l2`."""
    out, init = [], ours["init"]
    for a, b in zip(ours["steps"], theirs["steps"], strict=True):
        d = rm_step_diffs(a, b, (ours["pairs"], theirs["pairs"]), init, 1)
        scale = max(float(m["rewards"].abs().max()) for m in a["micro"])
        loss_scale = max(abs(m["loss"]) for m in a["micro"])
        weights, update = relative_l2(a["weights"], b["weights"], init)
        out.append({"ids": d["ids"], "rewards": d["rewards"] / scale, "loss": d["loss"] / loss_scale,
                    "grad_norm": d["grad_norm"], "lr": d["lr"], "weights_l2": weights, "update": update})
    return out


def _rl_rank_step(ours: dict, theirs: dict) -> dict[str, float]:
    """One rank's figures of one RL step (its own rows, as each side's rank computed them)."""
    mask = ours["mask"].bool()  # [n, R]
    adv = theirs["advantages"] if theirs["advantages"].dim() == 2 else theirs["advantages"][:, None]  # [n, R|1]
    out = {**_layout(ours, theirs), "advantages": _max((ours["advantages"] - adv[:, :mask.shape[1]])[mask])}
    loss_scale = max(abs(a["loss"]) for a in ours["micro"])
    lp, loss = [], []
    for a, b in zip(ours["micro"], theirs["micro"], strict=True):
        m = mask[a["rows"]][:, :b["logprobs"].shape[1]]  # [k, R]
        ours_lp = a["logprobs"][:, :m.shape[1]][m]
        lp.append(_max(ours_lp - b["logprobs"][m]) / max(_max(ours_lp), 1e-12))
        loss.append(abs(a["loss"] - b["loss"]) / max(loss_scale, 1e-12))
    grad = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours["grad_norm"], theirs["grad_norm"], strict=True))
    lr = max(abs(a - b) for a, b in zip(ours["lr"], theirs["lr"], strict=True))
    return {**out, "logprobs": max(lp), "loss": max(loss), "grad_norm": grad, "lr": lr}


def engine_rl_diffs(ours: dict, theirs: dict) -> list[dict[str, float]]:
    """Per RL step of an RL engine check, the largest figure over the ranks (``ranks``: each side's per-rank steps,
    in rank order, rank r of each side on the same rows) in :data:`ENGINE_TOL`'s units, and the master weights after
    the step (``steps[i]["weights"]``) as :func:`relative_l2` against ``ours["init"]``."""
    if len(ours["ranks"]) != len(theirs["ranks"]):
        raise AssertionError(f"{len(ours['ranks'])} ranks recorded on our side, {len(theirs['ranks'])} on the source's")
    out = []
    for i, (a, b) in enumerate(zip(ours["steps"], theirs["steps"], strict=True)):
        per_rank = [_rl_rank_step(r[i], s[i]) for r, s in zip(ours["ranks"], theirs["ranks"], strict=True)]
        weights, update = relative_l2(a["weights"], b["weights"], ours["init"])
        out.append({**{k: max(f[k] for f in per_rank) for k in per_rank[0]}, "weights_l2": weights,
                    "update": update})
    return out


def engine_failures(per_step: list[dict[str, float]]) -> list[str]:
    """Each figure of an engine check beyond :data:`ENGINE_TOL`, as a line."""
    return [f"step {i + 1}: {k} differs by {v:.3g} (tolerance {ENGINE_TOL[k]:g})"
            for i, d in enumerate(per_step) for k, v in d.items() if k in ENGINE_TOL and not v <= ENGINE_TOL[k]]


def main(argv: list[str]) -> None:
    """``python -m tests.fidelity.compare_engine DIR PACKAGE``: the per-step figures of an engine check's
    ``DIR/ours.pt`` and ``DIR/PACKAGE.pt`` (its drivers run by hand, docs/fidelity.md "Engines"), and what fails."""
    from pathlib import Path

    from tests.fidelity.compare import vacuous

    if len(argv) != 2:
        raise SystemExit(main.__doc__)
    ours, theirs = (torch.load(Path(argv[0]) / f"{name}.pt", weights_only=False) for name in ("ours", argv[1]))
    per_step = engine_rm_diffs(ours, theirs) if "pairs" in ours else engine_rl_diffs(ours, theirs)
    for i, d in enumerate(per_step):
        print(f"step {i + 1}: " + ", ".join(f"{k} {v:.3g}" for k, v in d.items()))
    print("\n".join(engine_failures(per_step) + vacuous(per_step, ours["steps"])) or "within tolerance")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
