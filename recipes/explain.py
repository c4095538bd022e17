"""``python -m recipes.explain recipe=NAME [overrides]``: a recipe's batch arithmetic before any GPU-hour is spent.

Prepares the config as ``recipes.run`` would (core/config/pipeline.py ``prepare``: every check a learner rank would
run, in a world of the layout's learners, as core/launch.py does), counts the training rows after the data filters
(when the data can be read here), and prints the run's plan (core/config/plan.py), in our keys and then in the
source framework's own flags (``source.name``, one view per framework in core/reporting/source_views.py):

- the GPUs: learners, rollout GPUs, engines and TP, nodes;
- one RL step: prompts, completions per prompt, completions; mini-batches and optimiser steps per step; each
  learner's prompts, micro-batch and accumulation;
- the run: rows after filtering, steps per epoch (drop-last), epochs covered, views per example, total optimiser
  steps, the schedule's length and warmup;
- ``source.notes``: where an article's figure differs from the source's.

A config that breaks an invariant prints the check's message and the arithmetic that fails, and exits 1.
"""
from __future__ import annotations

import sys

from core.reporting.source_views import SOURCE_VIEWS


def numbers(plan) -> dict:
    """Every figure of an RL recipe's plan (core/config/plan.py), by the names the lines and views use (``rows``:
    training rows after the filters, None when unknown)."""
    lay = plan.layout
    n = {"learners": plan.world_size, "rollout_gpus": lay.rollout_gpus, "nodes": lay.nodes,
         "gpus_per_node": lay.gpus_per_node, "mode": lay.mode, "engines": lay.engines, "tp": lay.tp,
         "prompts": plan.prompts_per_step, "group": plan.group_size, "samples": plan.samples_per_step,
         "mini": plan.mini_batch_size, "mini_batches": plan.mini_batches, "ppo_epochs": plan.ppo_epochs,
         "updates_per_step": plan.optimizer_steps_per_rl_step, "micro": plan.micro_batch_size,
         "accum": plan.grad_accum, "samples_per_learner": plan.samples_per_rank, "rows": plan.rows,
         "total_steps": plan.total_steps, "total_updates": plan.total_optimizer_steps}
    n["steps_per_epoch"] = plan.rows // plan.prompts_per_step if plan.rows is not None else None
    if n["total_steps"] is not None and n["steps_per_epoch"]:
        n["epochs"] = n["total_steps"] / n["steps_per_epoch"]
        n["views"] = n["epochs"] * plan.group_size
    if n["total_updates"] is not None:
        n["warmup"] = plan.warmup
    return n


def lines(cfg, n: dict) -> list[str]:
    """The explanation in our keys."""
    out = [f"recipe {cfg.recipe_name}" + (f"  (source: {cfg.source.ref})" if cfg.source.ref else "")]
    gpus = f"{n['learners']} learner GPU(s)"
    if n["mode"] == "dedicated":
        gpus += f" + {n['rollout_gpus']} rollout GPU(s)"
    out.append(f"GPUs: {gpus} on {n['nodes']} node(s) x {n['gpus_per_node']}; {n['engines']} vLLM engine(s) x TP "
               f"{n['tp']} ({n['mode']})")
    out.append(f"one RL step: train.prompts_per_step {n['prompts']} x train.group_size {n['group']} = {n['samples']} "
               f"completions")
    out.append(f"  train.mini_batch_size {n['mini']} completions -> {n['mini_batches']} mini-batch(es) x "
               f"train.ppo_epochs {n['ppo_epochs']} = {n['updates_per_step']} optimiser step(s) per RL step")
    out.append(f"  per learner: {_num(n['samples_per_learner'])} completions, {n['mini'] // n['learners']} per "
               f"optimiser step = train.micro_batch_size {n['micro']} x {n['accum']} accumulated")
    if n["rows"] is None:
        out.append("data: rows not readable here, so epochs are not derived")
    else:
        out.append(f"data: {n['rows']} training rows after the filters -> {n['steps_per_epoch']} RL steps per epoch "
                   f"(prompts_per_step {n['prompts']}, last partial batch dropped)")
    if n["total_steps"] is not None:
        run = f"run: {n['total_steps']} RL steps"
        if "epochs" in n:
            run += f" = {n['epochs']:.2f} epochs, about {n['views']:.0f} views of each example"
        out.append(run)
        out.append(f"  {n['total_steps']} x {n['updates_per_step']} = {n['total_updates']} optimiser steps; schedule "
                   f"{cfg.optim.scheduler.name} over {n['total_updates']}, warmup {n['warmup']}")
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


def explain(overrides: list[str]) -> list[str]:
    """The explanation of ``overrides`` as printed lines; raises the config's own error when it cannot run."""
    from core.config.pipeline import prepare

    prepared = prepare(overrides, launched=True, packages=False)  # explains anywhere: the gpu extra may be absent
    if prepared.config.loop != "rl":
        raise SystemExit(f"recipes.explain explains RL recipes; loop={prepared.config.loop}")
    return explanation(prepared, *_train_rows(prepared.config))


def explanation(prepared, rows: int | None, why: str = "") -> list[str]:
    """The lines of a prepared RL config (core/config/pipeline.py) with ``rows`` training rows (None: unknown,
    ``why`` says why); raises the config's own error when a step needs more prompts than there are rows."""
    cfg, plan = prepared.config, prepared.plan
    n = numbers(plan if rows is None else plan.for_rows(rows))
    out = lines(cfg, n)
    if why:
        out.append(f"  (rows: {why})")
    view = SOURCE_VIEWS.get(cfg.source.name)(cfg, n)
    if view:
        out.append(f"in {cfg.source.name}'s flags:")
        out += [f"  {flag}: {value}" for flag, value in view]
    for note in cfg.source.notes:
        out.append(f"note: {note}")
    return out


def _train_rows(cfg) -> tuple[int | None, str]:
    """Training rows after the character filter, and after the token filter when the tokenizer loads here."""
    from core.data import prompts as D

    try:
        rows = D.load_split(cfg.data, "train")
    except Exception as e:  # noqa: BLE001 (a hub dataset offline, a missing file: explained, not fatal)
        return None, f"{type(e).__name__}: {e}"
    if not cfg.data.max_prompt_tokens:
        return len(rows), ""
    try:
        from core.models.loading import load_tokenizer, model_dir

        rows, _ = D.tokenize_rows(rows, cfg.data, load_tokenizer(model_dir(cfg.model)))
    except Exception as e:  # noqa: BLE001
        return len(rows), f"before data.max_prompt_tokens (tokenizer not loadable here: {type(e).__name__})"
    return len(rows), ""


def main(argv: list[str]) -> None:
    from core.errors import tool_main

    tool_main(lambda a: print("\n".join(explain(a))), argv, __doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
