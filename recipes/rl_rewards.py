"""The scoring half of an RL step (``recipes/rl.py`` ``rl_step`` and ``evaluate``): completions decoded, read as
``verifier.text`` says and scored by the verifier (``None``: skipped), and a few of them logged with their rewards.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from core.rollout import RolloutBatch
from core.rollout.texts import REWARD_TEXTS
from verifiers import get_verifier

if TYPE_CHECKING:
    from recipes.rl import Run


def score(run: Run, roll: RolloutBatch, rows: list[dict], evaluation: bool = False):
    """Verifier rewards ``[N]``, a validity mask ``[N]`` (False where the verifier said None), on the run's
    device, and the decoded completions; ``evaluation``: by ``verifier.eval_name`` (with ``eval_kwargs``) when set."""
    texts, v = decode_responses(run.tokenizer, roll), run.cfg.verifier
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    fn, kwargs = (get_verifier(v.eval_name), v.eval_kwargs) if evaluation and v.eval_name else (run.verifier, v.kwargs)
    read = REWARD_TEXTS.get(v.text)(run.tokenizer, roll, texts)  # verifier.text: what it reads
    rewards = fn(read, **cols, **kwargs)
    valid = torch.tensor([r is not None for r in rewards], device=run.device)
    return torch.tensor([0.0 if r is None else float(r) for r in rewards], device=run.device), valid, texts


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
