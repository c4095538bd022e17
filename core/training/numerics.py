"""Non-finite numbers in a training step: found the same way on every rank, then the run stops or skips the step.

``train.on_nonfinite`` (both loops): ``stop`` (default) raises :class:`NonFiniteError` naming the step and each
quantity; ``skip`` takes no optimiser step for it and logs ``nonfinite/skipped`` (1 on such a step, else 0) and, on
it, ``nonfinite/<quantity>``, the count of non-finite values. Either way the offending batch is saved to
``<run dir>/nonfinite/step-<N>.json`` (every rank's rows, in rank order).

The quantities: the RL loop's rewards (an infinite one: a NaN reward is a missing one by design, TRL's ``None``,
masked per ``train.shaping.none_reward``) and advantages, checked before the update, so a bad rollout takes no
optimiser step at all; both loops' loss and gradient norm (and the critic's), checked after it, when an optimiser
step whose gradient norm is not finite has not been taken (the plain engine's guard, core/training/engine.py, as
veRL's ``dp_actor._optimizer_step`` skips one; under ZeRO DeepSpeed's own overflow check, which skips it and reports
the norm as inf). Counts are summed over ranks in one all-reduce (the loss and the gradient norm are equal on every
rank already), so every rank stops or skips the same step.

What the sources do: TRL and OpenRLHF leave a NaN to the optimiser (under DeepSpeed, its overflow skip); veRL skips the
optimiser step of a non-finite gradient norm with a warning; none stops the run or saves the batch.
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Callable

import torch

from core.training import distributed

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """A step produced a NaN or an infinity where it must not (``train.on_nonfinite=stop``)."""


def nonfinite_counts(local: dict[str, torch.Tensor], agreed: dict[str, float]) -> dict[str, list[int]]:
    """``{quantity: [non-finite values, values]}`` for the quantities that hold any: ``local`` tensors counted over
    every rank (one all-reduce, so every rank gets the same answer), ``agreed`` scalars (equal on every rank: the
    loss and gradient norm, reduced already) as they are."""
    names = list(local)
    counts = {}
    if names:
        per = torch.stack([torch.stack([(~torch.isfinite(local[n])).sum(), torch.tensor(local[n].numel(),
                           device=local[n].device)]).double().cpu() for n in names])  # [Q, 2]
        counts = dict(zip(names, distributed.all_sum(per).long().tolist()))
    counts.update({n: [int(not math.isfinite(v)), 1] for n, v in agreed.items()})
    return {n: c for n, c in counts.items() if c[0]}


def guard(step: int, mode: str, run_dir: Path, local: dict, agreed: dict,
          records: Callable[[], list[dict]]) -> dict[str, list[int]]:
    """Check a step's quantities (:func:`nonfinite_counts`); on a fault save the batch (``records()``: this rank's
    rows) and raise :class:`NonFiniteError` (``mode`` stop) or return the counts (skip); ``{}`` when all are finite."""
    counts = nonfinite_counts(local, agreed)
    if not counts:
        return counts
    path = save_batch(run_dir, step, mode, counts, records())
    what = describe(counts)
    if mode == "stop":
        raise NonFiniteError(f"step {step}: non-finite {what}; the run stops (train.on_nonfinite=stop) before this "
                             f"step reaches the weights or the records. The batch is in {path}. To skip such steps, "
                             f"rerun with resume=auto train.on_nonfinite=skip (it continues from the last checkpoint)")
    log.warning("step %d: non-finite %s: skipped (no optimiser step; train.on_nonfinite=skip); batch in %s", step,
                what, path)
    return counts


def describe(counts: dict[str, list[int]]) -> str:
    return ", ".join(f"{n} ({bad} of {total} values)" if total > 1 else n for n, (bad, total) in counts.items())


def skip_metrics(mode: str, counts: dict[str, list[int]]) -> dict[str, float]:
    """Under ``skip``, ``nonfinite/skipped`` (1 on a skipped step, else 0) and the non-finite count of each quantity
    that caused it; nothing under ``stop`` (a fault ends the run there)."""
    if mode != "skip":
        return {}
    return {"nonfinite/skipped": float(bool(counts)), **{f"nonfinite/{n}": float(c[0]) for n, c in counts.items()}}


def save_batch(run_dir: Path, step: int, mode: str, counts: dict, rows: list[dict]) -> Path:
    """Every rank's ``rows`` (rank order) into ``<run_dir>/nonfinite/step-<step>.json``, written atomically by rank 0
    (collective); non-finite floats as the strings "nan", "inf", "-inf", so the file is plain JSON."""
    everyone = [r for part in distributed.gather_objects(rows) for r in part]
    path = Path(run_dir) / "nonfinite" / f"step-{step}.json"
    if distributed.is_main():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(_plain({"step": step, "on_nonfinite": mode, "nonfinite": counts, "rows": everyone}),
                                  indent=1, allow_nan=False))
        os.replace(tmp, path)
    return path


def _plain(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def completion_records(rows: list[dict], texts: list[str], rewards: torch.Tensor, valid: torch.Tensor,
                       adv: torch.Tensor, mask: torch.Tensor) -> list[dict]:
    """An RL batch's rows for :func:`save_batch`: prompt, answer, completion, reward (None: missing) and the
    advantage over the completion's tokens (mean, min, max, non-finite count; one value under GRPO)."""
    out = []
    for i, row in enumerate(rows):
        a = adv[i][mask[i].bool()].double()  # [R_i] this completion's token advantages
        bad = ~torch.isfinite(a)
        fin = a[~bad]
        out.append({"prompt": row.get("prompt"), "answer": row.get("answer"), "completion": texts[i],
                    "reward": rewards[i].item() if valid[i] else None,
                    "advantage": {"mean": a.mean().item() if len(a) else None,
                                  "min": fin.min().item() if len(fin) else None,
                                  "max": fin.max().item() if len(fin) else None, "nonfinite": int(bad.sum())}})
    return out
