"""``python -m recipes.explain recipe=NAME [overrides]``: a recipe's batch arithmetic before any GPU-hour is spent.

Composes the config as ``recipes.run`` would, runs every check a learner rank would run (in a world of the layout's
learners, as core/launch.py does), counts the training rows after the data filters (when the data can be read
here), and prints, in our keys and then in the source framework's own flags (``source.name``, one view per
framework in core/reporting/source_views.py):

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


def numbers(cfg, rows: int | None) -> dict:
    """Every derived figure of an RL recipe (``rows``: training rows after the filters, None when unknown)."""
    from core.config.layout import engines, tensor_parallel
    from core.config.validate import rl_batch_plan
    from core.training.optim import warmup_steps

    t, lay = cfg.train, cfg.layout
    learners = int(lay.learner_gpus)
    plan = rl_batch_plan(cfg, learners)
    P, G = int(t.prompts_per_step), int(t.group_size)
    samples = P * G
    n = {"learners": learners, "rollout_gpus": int(lay.rollout_gpus), "nodes": int(lay.nodes),
         "gpus_per_node": int(lay.gpus_per_node), "mode": str(lay.mode), "engines": engines(cfg),
         "tp": tensor_parallel(cfg), "prompts": P, "group": G, "samples": samples,
         "mini": int(t.mini_batch_size), "mini_batches": samples // int(t.mini_batch_size),
         "ppo_epochs": int(t.ppo_epochs), "updates_per_step": plan["optimizer_steps_per_rl_step"],
         "micro": int(t.micro_batch_size), "accum": plan["grad_accum"],
         "samples_per_learner": samples / learners, "rows": rows}
    n["steps_per_epoch"] = rows // P if rows is not None else None
    epochs = t.get("epochs")
    if epochs and n["steps_per_epoch"] is not None:
        n["total_steps"] = int(epochs) * n["steps_per_epoch"]
    else:
        n["total_steps"] = int(t.total_steps) if t.total_steps is not None else None
    if n["total_steps"] is not None and n["steps_per_epoch"]:
        n["epochs"] = n["total_steps"] / n["steps_per_epoch"]
        n["views"] = n["epochs"] * G
    n["total_updates"] = n["total_steps"] * n["updates_per_step"] if n["total_steps"] is not None else None
    sched = cfg.optim.scheduler
    if n["total_updates"] is not None:
        n["warmup"] = warmup_steps(sched, n["total_updates"])
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
    from core.config.composition import compose
    from core.config.validate import check_rl, final_config

    cfg = compose(overrides, with_hydra=True)
    learners = int(cfg.layout.learner_gpus)
    cfg = final_config(cfg, world=learners, packages=False)  # explains anywhere: the gpu extra may be absent
    if cfg.loop != "rl":
        raise SystemExit(f"recipes.explain explains RL recipes; loop={cfg.loop}")
    rows, why = _train_rows(cfg)
    check_rl(cfg, world_size=learners, num_train_rows=rows, packages=False)
    n = numbers(cfg, rows)
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
    from core.errors import InputError

    try:
        print("\n".join(explain(argv)))
    except InputError as e:
        sys.exit(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
