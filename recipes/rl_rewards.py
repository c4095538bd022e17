"""The scoring half of an RL step (``recipes/rl.py`` ``rl_step``) and the greedy held-out evaluation: completions
decoded, read as ``verifier.text`` says and scored by the verifier (``None``: skipped), the step's reward metrics
(accuracy by the correctness term, each weighted term's mean: verifiers/correctness.py), and a few completions
logged with their rewards.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from core.rollout import RolloutBatch, Sampling, sampling_seed
from core.rollout.texts import REWARD_TEXTS
from core.training import distributed
from verifiers.correctness import Scorer

if TYPE_CHECKING:
    from recipes.rl import Run


class Scorers(NamedTuple):
    """The training verifier and the greedy evaluation's (``verifier.eval_name``, else the same), each counting
    accuracy by its correctness term."""

    train: Scorer
    eval: Scorer


def scorers(v) -> Scorers:
    """``verifier.*`` as scorers; ``verifier.accuracy_term`` names the training reward's accuracy term, and the
    evaluation's when that is a weighted sum too (checked before any model: core/config/validate.py)."""
    train = Scorer(v.name, v.kwargs, v.accuracy_term)
    if not v.eval_name:
        return Scorers(train, train)
    term = v.accuracy_term if v.eval_name == "weighted" else None
    return Scorers(train, Scorer(v.eval_name, v.eval_kwargs, term))


@dataclass
class Scored:
    """One batch's scores, on the run's device: rewards ``[N]`` (0 where skipped), ``valid [N]`` (False where the
    verifier said None), ``correct [N]`` by the accuracy term and ``judged [N]`` (it gave a verdict), each weighted
    term's rewards ``terms [N, T]`` (NaN where None; T = 0 for a plain verifier) named by ``labels``, and the
    decoded completions."""

    raw: torch.Tensor
    valid: torch.Tensor
    correct: torch.Tensor
    judged: torch.Tensor
    terms: torch.Tensor
    labels: list[str]
    texts: list[str]


def score(run: Run, roll: RolloutBatch, rows: list[dict], evaluation: bool = False) -> Scored:
    """The batch scored by the run's verifier, or with ``evaluation`` by the evaluation's (``verifier.eval_name``
    with ``eval_kwargs`` when set)."""
    texts, v = decode_responses(run.tokenizer, roll), run.cfg.verifier
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    scorer = run.verifier.eval if evaluation else run.verifier.train
    s = scorer(REWARD_TEXTS.get(v.text)(run.tokenizer, roll, texts), **cols)  # verifier.text: what it reads
    dev, nan = run.device, float("nan")

    def values(xs) -> torch.Tensor:
        return torch.tensor([nan if x is None else float(x) for x in xs], dtype=torch.float32, device=dev)

    raw, ok, labels = values(s.rewards), s.correct, list(s.terms)
    terms = torch.stack([values(s.terms[k]) for k in labels], 1) if labels else raw[:, None][:, :0]  # [N, T]
    return Scored(raw.masked_fill(raw.isnan(), 0.0), ~raw.isnan(),  # an inf stays: numerics.guard stops on it
                  torch.tensor([bool(c) for c in ok], device=dev).float(),
                  torch.tensor([c is not None for c in ok], device=dev), terms, labels, texts)


def reward_metrics(s: Scored, shaped: torch.Tensor) -> dict[str, float]:
    """The step's reward statistics over every rank's rows: the verifier's reward (what trains) mean, std and
    skipped count, and the mean of its ``shaped`` scores ``[N]``; ``accuracy``, the share of judged completions its
    correctness term calls correct; each weighted term's mean over the completions it scored
    (``rewards/<term>/mean``, TRL's names)."""
    raw, shaped, correct, terms = (distributed.gather_rows(x.float()) for x in (s.raw, shaped, s.correct, s.terms))
    valid, judged = (distributed.gather_rows(x.float()).bool() for x in (s.valid, s.judged))
    nan = float("nan")
    return {
        "reward/mean": raw[valid].mean().item(), "reward/std": raw[valid].std().item() if valid.sum() > 1 else 0.0,
        "reward/shaped_mean": shaped[valid].mean().item(),
        "reward/skipped": int((~valid).sum()), "accuracy": correct[judged].mean().item() if judged.any() else nan,
        **{f"rewards/{k}/mean": terms[:, j].nanmean().item() for j, k in enumerate(s.labels)},
    }


@torch.no_grad()
def evaluate(run: Run) -> float:
    """Greedy accuracy on the held-out prompts (``train.eval_prompts`` of them; 0 = all): the share of those the
    evaluation's correctness term judged that it calls correct; each rank scores its share, and the correct and
    judged counts are summed over ranks."""
    data, world = run.data, distributed.world()
    n = run.cfg.train.eval_prompts or len(data.eval_rows)
    share = slice(distributed.rank(), n, world)
    rows, ids = data.eval_rows[:n][share], data.eval_ids[:n][share]
    counts = torch.zeros(2, dtype=torch.float64)  # [correct, judged]
    run.gen.push(run.engine, run.step)  # settles a generation in flight first; collective under ZeRO-3
    with run.engine.gathered(run.rollout.gathers_policy):  # collective under ZeRO-3: every rank enters, rows or not
        if run.rollout.collective:  # as many prompts as every other rank (so as many synced generate chunks):
            ids = ids + data.eval_ids[:1] * (-(-n // world) - len(ids))  # stand-ins fill a short share, then go
        if ids:  # rows numbered rank-major (a share holds at most ceil(n / world)); no log-probs are read
            seed = sampling_seed(run.cfg.seed, "eval", run.step)
            sampling = Sampling.from_cfg(run.cfg.rollout, greedy=True, seed=seed,
                                         first_row=distributed.rank() * -(-n // world), logprobs=False)
            roll = run.rollout.generate(ids, sampling).head(len(rows))
        if rows:
            s = score(run, roll, rows, evaluation=True)
            counts += torch.tensor([float(s.correct.sum()), float(s.judged.sum())], dtype=torch.float64)
    correct, judged = distributed.all_sum(counts).tolist()
    return correct / judged if judged else float("nan")


def log_samples(run: Run, rows: list[dict], texts: list[str], raw, valid, finish: list[str]) -> None:
    """At the first and last step and every ``logger.samples_every`` steps (0: never), ``logger.samples`` of this
    rank's completions, one per prompt group, with prompt, reward and finish reason (``samples.jsonl``, TensorBoard
    text)."""
    every, step = run.cfg.logger.samples_every, run.step + 1  # the step these rows will be logged as
    if not every or (step % every and step not in (1, run.plan.total_steps)):
        return
    G = run.cfg.train.group_size
    picks = range(0, len(rows), G)[:run.cfg.logger.samples]
    run.writer.samples(step, [{"prompt": rows[i]["prompt"], "completion": texts[i], "answer": rows[i].get("answer"),
                               "reward": raw[i].item() if valid[i] else None, "finish": finish[i]} for i in picks])


def decode_responses(tokenizer, roll: RolloutBatch) -> list[str]:
    ids = roll.response_ids.masked_fill(roll.response_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
