"""``python -m recipes.explain recipe=NAME [--count-rows] [overrides]``: a recipe's batch arithmetic before any
GPU-hour is spent.

Prepares the config as ``recipes.run`` would (core/config/pipeline.py ``prepare``: every check a learner rank would
run, in a world of the layout's learners, as core/launch.py does), counts the training rows after the data filters
(a generated or local source is read; a hub dataset is not downloaded: its published row count, ``data.published_rows``,
stands in, and ``--count-rows`` downloads the split to count the rows after the filters), and prints the run's plan
(core/config/plan.py), in our keys and then in the source framework's own flags (``source.name``, one view per
framework in core/reporting/source_views.py):

- the GPUs: learners, rollout GPUs, nodes, and what generates (``rollout.engine``: vLLM engines and TP, or ``hf``
  generate on each learner);
- one RL step: prompts, completions per prompt, completions; mini-batches and optimiser steps per step; each
  learner's prompts, micro-batch and accumulation;
- the run: rows after filtering, steps per epoch (drop-last), epochs covered, views per example, total optimiser
  steps, the schedule's length and warmup; the views of each example (completions generated per training row);
- ``source.notes``: where an article's figure differs from the source's;
- the source release the recipe's step was checked against (tests/fidelity/sources.yaml, docs/fidelity.md).

A reward-model recipe (``loop: rm``, recipes/rm.py) gets its own lines: the GPUs; one optimiser step's pairs and
sequences, each learner's share as micro-batch x accumulation; the tokens a step holds (bounded by ``train.max_len``,
or not, where a length filter keeps long pairs whole); the pairs after the filters (a hub dataset's only with
``--count-rows``), steps per epoch and the run's optimiser steps, schedule and warmup.

A config that breaks an invariant prints the check's message and the arithmetic that fails, and exits 1.
"""
from __future__ import annotations

import sys

from core.registry import Registry
from core.reporting.source_views import SOURCE_VIEWS

# ``loop`` -> fn(prepared, count_rows) -> the printed lines
EXPLANATIONS: Registry = Registry("recipes.explain loop")


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
        # completions generated per training row over the run (drop-last epochs leave some rows out of each)
        n["views"] = n["total_steps"] * plan.samples_per_step / plan.rows
    if n["total_updates"] is not None:
        n["warmup"] = plan.warmup
    return n


def lines(cfg, n: dict) -> list[str]:
    """The explanation in our keys."""
    out = [f"recipe {cfg.recipe_name}" + (f"  (source: {cfg.source.ref})" if cfg.source.ref else "")]
    gpus = f"{n['learners']} learner GPU(s)"
    if n["mode"] == "dedicated":
        gpus += f" + {n['rollout_gpus']} rollout GPU(s)"
    out.append(f"GPUs: {gpus} on {n['nodes']} node(s) x {n['gpus_per_node']}; {_generation(cfg, n)}")
    out.append(f"one RL step: train.prompts_per_step {n['prompts']} x train.group_size {n['group']} = {n['samples']} "
               f"completions")
    out.append(f"  train.mini_batch_size {n['mini']} completions -> {n['mini_batches']} mini-batch(es) x "
               f"train.ppo_epochs {n['ppo_epochs']} = {n['updates_per_step']} optimiser step(s) per RL step")
    out.append(f"  per learner: {_num(n['samples_per_learner'])} completions, {n['mini'] // n['learners']} per "
               f"optimiser step = train.micro_batch_size {n['micro']} x {n['accum']} accumulated")
    if n["rows"] is None:
        out.append("data: rows not readable here, so epochs are not derived")
    else:
        counted = "as published" if n.get("published") else "after the filters"
        out.append(f"data: {n['rows']} training rows {counted} -> {n['steps_per_epoch']} RL steps per epoch "
                   f"(prompts_per_step {n['prompts']}, last partial batch dropped)")
    if n["total_steps"] is not None:
        run = f"run: {n['total_steps']} RL steps"
        if "epochs" in n:
            run += (f" = {n['epochs']:.2f} epochs, about {n['views']:.0f} views of each example ({n['total_steps']} x "
                    f"{n['samples']} completions / {n['rows']} rows)")
        out.append(run)
        out.append(f"  {n['total_steps']} x {n['updates_per_step']} = {n['total_updates']} optimiser steps; schedule "
                   + _schedule(cfg.optim, n))
    return out


def _schedule(optim, n: dict) -> str:
    """The schedule's length and warmup in its own steps; one stepped per RL step says the first RL step's lr."""
    from core.training.optim import lr_factors, per_rl_step

    sched = optim.scheduler
    if not per_rl_step(sched.name):
        return f"{sched.name} over {n['total_updates']}, warmup {n['warmup']}"
    first = lr_factors(sched, n["total_updates"], n["updates_per_step"], 1)[0] * float(optim.optimizer.lr)
    return (f"{sched.name} over {n['total_steps']} RL steps (one lr per RL step), warmup {n['warmup']}: RL step 1 at "
            f"lr {first:g}")


def _generation(cfg, n: dict) -> str:
    """What generates the rollouts: vLLM engines (colocated or dedicated) or ``hf`` generate on each learner."""
    engine = cfg.rollout.engine
    if engine == "hf":
        return "rollout.engine=hf: transformers generate on each learner, no vLLM engine"
    return f"rollout.engine={engine}: {n['engines']} vLLM engine(s) x TP {n['tp']} ({n['mode']})"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"


COUNT_ROWS = "--count-rows"  # download a hub dataset's train split to count its rows after the filters


def explain(argv: list[str]) -> list[str]:
    """The explanation of ``argv`` (overrides, and :data:`COUNT_ROWS`) as printed lines; raises the config's own
    error when it cannot run."""
    from core.config.pipeline import prepare

    overrides = [a for a in argv if a != COUNT_ROWS]
    prepared = prepare(overrides, launched=True, packages=False)  # explains anywhere: the gpu extra may be absent
    lines_of_loop = EXPLANATIONS.get(prepared.config.loop)(prepared, COUNT_ROWS in argv)
    return lines_of_loop + _fidelity(prepared.config.recipe_name)


@EXPLANATIONS.register("rl")
def rl_explanation(prepared, count: bool) -> list[str]:
    """An RL recipe's lines, its training rows counted as :func:`_train_rows` says."""
    published = prepared.config.data.source == "hub" and not count
    return explanation(prepared, *_train_rows(prepared.config, count), published=published)


EXPLANATIONS.declare("rm", "recipes.explain_rm:rm_explanation")


def explanation(prepared, rows: int | None, why: str = "", published: bool = False) -> list[str]:
    """The lines of a prepared RL config (core/config/pipeline.py) with ``rows`` training rows (None: unknown,
    ``why`` says why; ``published``: the dataset card's count, before the filters); raises the config's own error
    when a step needs more prompts than there are rows."""
    cfg, plan = prepared.config, prepared.plan
    n = numbers(plan if rows is None else plan.for_rows(rows))
    n["published"] = published
    out = lines(cfg, n)
    if why:
        out.append(f"  (rows: {why})")
    out += release_lines(cfg.source)
    view = SOURCE_VIEWS.get(cfg.source.name)(cfg, n)
    if view:
        out.append(f"in {cfg.source.name}'s flags:")
        out += [f"  {flag}: {value}" for flag, value in view]
    for note in cfg.source.notes:
        out.append(f"note: {note}")
    return out


def _fidelity(recipe: str) -> list[str]:
    """The line of tests/fidelity/sources.yaml for ``recipe``: the source release its step was checked against by
    ``make fidelity``, or that its source (not a package) keeps function-level checks (docs/fidelity.md); none for a
    recipe the file does not name, or outside a checkout."""
    import yaml

    from core.paths import PROJECT_ROOT

    path = PROJECT_ROOT / "tests" / "fidelity" / "sources.yaml"
    src = yaml.safe_load(path.read_text()).get(recipe) if path.exists() else None
    if src is None:
        return []
    if src["check"] == "step":
        eng = src.get("engine")
        again = (f", and again in {eng['dtype']} at its sharding on {eng['ranks']} CPU ranks ({eng['zero']} ours)"
                 if eng else "")
        return [f"fidelity: step checked against {src['package']} {src['version']}'s own code{again} (make fidelity; "
                f"docs/fidelity.md)"]
    return ["fidelity: function-level checks only, its source is not a package (docs/fidelity.md)"]


def release_lines(source) -> list[str]:
    """The published run a recipe reproduces and the framework release whose defaults it takes (``source.defaults``:
    core/config/release.py)."""
    out = [f"reproduces: {source.run}"] if source.run else []
    if source.release:
        took = source.written_release if source.defaults == "written" else source.release
        other = "pinned" if source.defaults == "written" else "written"
        alt = source.release if other == "pinned" else source.written_release
        out.append(f"defaults: {took} (source.defaults={source.defaults}; source.defaults={other}: {alt})")
    return out


def _train_rows(cfg, count: bool = False) -> tuple[int | None, str]:
    """Training rows after the character filter, and after the token filter when the tokenizer loads here. A hub
    dataset is read only when ``count``: else its published rows (``data.published_rows``, before the filters)."""
    from core.data import prompts as D

    data = cfg.data
    if data.source == "hub" and not count:
        filters = [f"data.{k}={data[k]}" for k in ("max_prompt_chars", "max_prompt_tokens") if data[k]]
        if data.published_rows is None:
            return None, f"{data.hub_name} is not downloaded to count them ({COUNT_ROWS} does)"
        before = f", before {' and '.join(filters)}" if filters else ""
        return data.published_rows, (f"as published for {data.hub_name} {data.split} (data.published_rows{before}); "
                                     f"{COUNT_ROWS} downloads the split to count them")
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
