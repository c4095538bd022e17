"""What a run says while it runs: the start summary, long phases announced and timed, one plain line per step.

Everything goes through :mod:`logging`, so Hydra's job logging sends it to the console and to ``run.log`` in the run
dir; the per-step line goes to the log files only (:func:`log_step`): the console has the progress bar, and a log
read later, or a console that is not a terminal (where the bar is one ``\\r``-joined line), has a line per step.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager

from core.training import distributed

# The per-step line's fields: (label, metrics key, format), those a step has, in this order.
STEP_FIELDS = (("reward", "reward/mean", ".3f"), ("acc", "accuracy", ".3f"), ("loss", "loss", ".4f"),
               ("kl", "kl", ".4f"), ("len", "length/mean", ".1f"), ("grad_norm", "grad_norm", ".3f"),
               ("lr", "lr", ".2e"), ("eval_acc", "eval/accuracy", ".3f"))


def start_summary(cfg, plan, run_dir, rows: dict[str, int], resuming: bool) -> str:
    """The run on one screen, before any model is built: recipe and scale, model, data (``rows``: rows per split
    as loaded and filtered), steps and batch arithmetic (``plan``: core/config/plan.py), the warm start (RL), the
    run dir and, when ``resume`` is set, whether a checkpoint continues."""
    lines = [f"{cfg.recipe_name}: {cfg.loop} loop, scale={cfg.scale.name}, seed={cfg.seed}",
             f"  model       {_model(cfg.model)}",
             f"  data        {_data(cfg.data)}: " + ", ".join(f"{n} {split}" for split, n in rows.items()),
             f"  steps       {_steps(cfg, plan)}"]
    if hasattr(plan, "warm_start"):
        ws = cfg.train.warm_start
        what = (f"up to {ws.steps} supervised steps on the training answers, until held-out accuracy "
                f"{ws.target_accuracy}" if plan.warm_start else "none")
        lines.append(f"  warm start  {what}: {plan.warm_start_why}")
    lines.append(f"  run dir     {run_dir}")
    if cfg.resume is not False:
        lines.append(f"  resume      {cfg.resume}: " + ("continues from the run dir's checkpoint" if resuming
                                                       else "no checkpoint there, a fresh run"))
    return "\n".join(lines)


def _model(m) -> str:
    if m.name_or_path:
        return f"{m.name_or_path} ({m.dtype})"
    tiny = m.tiny or {}
    return (f"tiny {m.arch} built locally (hidden {tiny.get('hidden_size')}, {tiny.get('num_hidden_layers')} "
            f"layers, init_seed {m.init_seed})")


def _data(d) -> str:
    where = d.get("path") or d.get("hub_name")
    return f"{d.source} {where}" if where else f"{d.source} (generated)"


def _steps(cfg, plan) -> str:
    ranks = f", {plan.world_size} ranks" if plan.world_size > 1 else ""
    if hasattr(plan, "group_size"):  # RL
        return (f"{plan.total_steps} RL steps of {plan.prompts_per_step} prompts x {plan.group_size} completions = "
                f"{plan.samples_per_step}; {plan.optimizer_steps_per_rl_step} optimiser step(s) each of "
                f"{plan.mini_batch_size} completions (micro-batch {plan.micro_batch_size} x {plan.grad_accum} "
                f"accumulated{ranks})")
    return (f"{plan.total_steps} optimiser steps of {plan.batch_size} pairs (micro-batch {plan.micro_batch_size} x "
            f"{plan.grad_accum} accumulated{ranks})")


@contextmanager
def announced(log: logging.Logger, what: str):
    """Log ``what ...`` before the phase and ``what: OUTCOME (N s)`` after it, OUTCOME what the phase appended to
    the list this yields (else "done"). Rank 0 alone speaks."""
    main, outcome = distributed.is_main(), []
    if main:
        log.info("%s ...", what)
    start = time.perf_counter()
    yield outcome
    if main:
        log.info("%s: %s (%.1f s)", what, "; ".join(outcome) or "done", time.perf_counter() - start)


def step_line(step: int, total: int, metrics: dict) -> str:
    """``step 3/8 reward 0.410 acc 0.380 kl 0.0012 ...``: the fields of :data:`STEP_FIELDS` the step has."""
    parts = [f"{label} {metrics[key]:{fmt}}" for label, key, fmt in STEP_FIELDS
             if isinstance(metrics.get(key), (int, float))]
    return " ".join([f"step {step}/{total}", *parts])


def log_step(log: logging.Logger, step: int, total: int, metrics: dict) -> None:
    """:func:`step_line` to the log files of the root logger (Hydra's ``run.log``), not to the console."""
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, step_line(step, total, metrics), (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and record.levelno >= handler.level:
            handler.handle(record)
