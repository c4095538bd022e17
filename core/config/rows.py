"""The checks that depend on the data, made once its rows are read and before any model is built (recipes/rl.py
``setup``): what a setting asks of the number of rows (a step's prompts, the warm start's held-out rows, a held-out
split to evaluate on), and what the reward does with a row (a function of one's own tried on one stand-in sample:
verifiers/trial.py). Every problem is listed at once, as :func:`core.config.validate.refuse` lists the config's.

The config checks (core/config/validate.py) run before the data is read, so they cannot know that the default
recipe's ``train.warm_start.holdout`` of 200 rows leaves nothing to train on in a 196-row file of one's own; here
that is a message naming the key, its value and the row count instead of a bare error from inside the warm start.
The loop runs these checks on the rows as read, then again on the rows the tokenizer's length limit kept
(``data.max_prompt_tokens``), with the reward's trial only the first time.
"""
from __future__ import annotations

from core.config.tokens import tokenizer_problem
from core.config.validate import refuse, reward_trial_problems


def checked_plan(cfg, plan, train_rows: list[dict], eval_rows: list[dict], trial: bool = True, tokenizer=None):
    """``plan.for_rows`` of the training rows, after :func:`rl_rows_problems` found none (else a ConfigError listing
    them); with ``tokenizer`` (loaded, the model not yet), that it fits the model's vocabulary too."""
    problem = tokenizer_problem(cfg.model, tokenizer) if tokenizer is not None else None
    refuse(([problem] if problem else []) + rl_rows_problems(cfg, plan, train_rows, eval_rows, trial))
    return plan.for_rows(len(train_rows))


def rl_rows_problems(cfg, plan, train_rows: list[dict], eval_rows: list[dict], trial: bool = True) -> list[str]:
    """Every reason the RL run of ``cfg`` and ``plan`` (core/config/plan.py ``RLPlan``) cannot run on these rows;
    with ``trial``, the reward's functions of one's own tried on the first row of each split."""
    n, errors = len(train_rows), []
    problem = plan.rows_problem(n)
    if problem:
        errors.append(problem)
    if not eval_rows:
        errors.append("data: the held-out split has no rows (after data.max_prompt_chars and data.max_prompt_tokens); "
                      "the greedy evaluation before and after RL needs some: set data.eval_path, data.eval_holdout or "
                      "data.eval_split")
    if plan.warm_start:
        errors += _warm_start_problems(cfg.train.warm_start, cfg.data, train_rows)
    if trial:
        errors += reward_trial_problems(cfg.verifier, train_rows[:1], eval_rows[:1])
    return errors


def _warm_start_problems(ws, data, train_rows: list[dict]) -> list[str]:
    """The warm start (core/models/warm_start.py) trains on the training rows' answers but its last ``holdout`` rows,
    and measures its accuracy on those."""
    n, errors = len(train_rows), []
    if ws.holdout >= n:
        fit = max(n // 10, 1) if n > 1 else None
        errors.append(f"train.warm_start.holdout={ws.holdout} with {n} training rows: the warm start measures its "
                      f"accuracy on {ws.holdout} training rows it never trains on and needs rows left to train on; "
                      + (f"set train.warm_start.holdout below {n} (a tenth: train.warm_start.holdout={fit}), or "
                         if fit else "use more training rows, or ")
                      + "train.warm_start.enabled=false")
    if train_rows and "answer" not in train_rows[0]:
        errors.append(f"train.warm_start.target={ws.target!r} needs each training row's answer, and "
                      f"data.answer_key={data.answer_key} gives none; set data.answer_key or "
                      f"train.warm_start.enabled=false")
    return errors
