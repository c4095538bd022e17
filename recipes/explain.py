"""``python -m recipes.explain recipe=NAME [overrides]``: a recipe's batch arithmetic before any GPU-hour is spent.

Prepares the config as ``recipes.run`` would (core/config/pipeline.py ``prepare``: every check a learner rank would
run, in a world of the layout's learners, as core/launch.py does), counts the training rows after the data filters
(when the data can be read here), and prints the run's plan (core/config/plan.py), in our keys and then in the
source framework's own flags (``source.name``, one view per framework in :data:`SOURCE_VIEWS`):

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

from core.registry import Registry

# source.name -> fn(cfg, numbers) -> [(source flag, value and how it follows from ours)]
SOURCE_VIEWS: Registry = Registry("source view")


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


@SOURCE_VIEWS.register("none")
def _no_source(cfg, n: dict) -> list[tuple[str, str]]:
    return []


@SOURCE_VIEWS.register("trl")
def _trl(cfg, n: dict) -> list[tuple[str, str]]:
    """TRL GRPOTrainer (Open-R1 on TRL 0.18): per_device_train_batch_size completions per process and micro-step,
    gradient_accumulation_steps of them per optimiser step; a generation batch of per_device_train_batch_size x
    processes x steps_per_generation completions (steps_per_generation defaults to gradient_accumulation_steps), each
    prompt num_generations times, which must divide it (trl grpo_config.py ``__post_init__``, v0.18.0)."""
    per_device, procs, t = n["micro"], n["learners"], cfg.train
    per_generation = n["samples"] // (per_device * procs)
    default = " (TRL's default: gradient_accumulation_steps)" if per_generation == n["accum"] else ""
    return [("num_processes", f"{procs}"),
            ("per_device_train_batch_size", f"{per_device} (train.micro_batch_size)"),
            ("gradient_accumulation_steps", f"{n['accum']} = {n['mini']} / ({per_device} x {procs})"),
            ("steps_per_generation", f"{per_generation}{default}"),
            ("num_generations", f"{n['group']}"),
            ("generation batch", f"{per_device} x {procs} x {per_generation} = {n['samples']} completions = "
                                 f"{n['prompts']} prompts x {n['group']}"),
            ("num_iterations", f"{n['ppo_epochs']}"),
            ("num_train_epochs / max_steps", f"{t.epochs} / -1" if t.epochs else f"(ignored) / {t.total_steps}")]


@SOURCE_VIEWS.register("verl")
def _verl(cfg, n: dict) -> list[tuple[str, str]]:
    """veRL (SimpleRL-Zoo's fork): batch sizes in prompts; ppo_mini_batch_size x rollout.n responses per optimiser step,
    divided over the ranks; micro-batches per GPU in responses; the deprecated global log-prob micro-batch divided by
    the ranks; one trainer step = one rollout; data.max_prompt_length filters characters; total_epochs x
    len(loader) steps, drop_last (reference simplerl_zoo.md §2, §8)."""
    flags = cfg.source.flags or {}
    rows = [("data.train_batch_size", f"{n['prompts']} prompts"),
            ("actor_rollout_ref.rollout.n", f"{n['group']} -> {n['samples']} responses per step"),
            ("actor.ppo_mini_batch_size", f"{n['mini'] // n['group']} prompts = {n['mini']} responses -> "
                                          f"{n['mini_batches']} optimiser steps per rollout"),
            ("actor.ppo_micro_batch_size_per_gpu", f"{n['micro']} ({n['mini']} / {n['learners']} GPUs / {n['micro']} = "
                                                   f"{n['accum']} accumulated, each a token mean / {n['accum']})"),
            ("actor.ppo_epochs", f"{n['ppo_epochs']}")]
    if flags.get("log_prob_micro_batch_size"):
        lp, ours = int(flags["log_prob_micro_batch_size"]), cfg.train.logprob_micro_batch_size
        rows.append(("log_prob_micro_batch_size", f"{lp} global // {n['learners']} GPUs = {lp // n['learners']} "
                                                  f"per GPU (train.logprob_micro_batch_size {ours})"))
    rows += [("rollout.tensor_model_parallel_size", f"{n['tp']} ({n['engines']} engines)"),
             ("trainer.nnodes x n_gpus_per_node", f"{n['nodes']} x {n['gpus_per_node']}"),
             ("a trainer step (global_steps)", f"one rollout of {n['prompts']} prompts and its {n['updates_per_step']} "
                                               f"optimiser steps = one RL step here")]
    if n["rows"] is not None and cfg.data.max_prompt_chars:
        raw = _rows_before_filters(cfg)
        rows.append(("data.max_prompt_length", f"{cfg.data.max_prompt_chars} characters of the prompt: "
                                               f"{raw if raw is not None else '?'} rows -> {n['rows']}"))
    if n["rows"] is not None and n["steps_per_epoch"]:
        per, steps = n["steps_per_epoch"], n["total_steps"]
        if flags.get("total_epochs"):
            rows.append(("trainer.total_epochs", f"{flags['total_epochs']} x {per} steps (drop_last) = "
                                                 f"{int(flags['total_epochs']) * per} steps"))
        if steps is not None:
            full, rest = divmod(steps, per)
            rows.append(("steps run", f"{steps} = {full} full epochs of {per} + {rest} steps: about {full} epochs, "
                                      f"{full} x rollout.n {n['group']} = {full * n['group']} views of each example"))
    return rows


def _rows_before_filters(cfg) -> int | None:
    """Training rows before ``data.max_prompt_chars`` (None when the data cannot be read here)."""
    from omegaconf import OmegaConf

    from core.data import prompts as D

    try:
        return len(D.load_split(OmegaConf.merge(cfg.data, {"max_prompt_chars": None}), "train"))
    except Exception:  # noqa: BLE001 (unreadable data is explained by the rows line already)
        return None


@SOURCE_VIEWS.register("open_instruct")
def _open_instruct(cfg, n: dict) -> list[tuple[str, str]]:
    """Open-Instruct ppo_vllm_thread_ray_gtrl.py: local_* sizes per learner; rollout batch = local_rollout_batch_size
    x learners prompts, each with number_samples_per_prompt completions; total_episodes // rollout batch steps
    (reference open_instruct.md §1.2)."""
    local = n["prompts"] // n["learners"]
    rows = [("--actor_num_gpus_per_node", f"{n['learners']} learners"),
            ("--vllm_num_engines x --vllm_tensor_parallel_size", f"{n['engines']} x {n['tp']}"),
            ("--local_rollout_batch_size", f"{local} -> {local} x {n['learners']} = {n['prompts']} prompts per step"),
            ("--number_samples_per_prompt", f"{n['group']}"),
            ("--local_mini_batch_size", f"{n['mini'] // n['learners']} -> {n['mini_batches']} mini-batch(es) per "
                                        f"epoch"),
            ("--per_device_train_batch_size", f"{n['micro']} (gradient accumulation {n['accum']})"),
            ("num_epochs (PPO)", f"{n['ppo_epochs']}")]
    episodes = (cfg.source.flags or {}).get("total_episodes")
    if episodes:
        steps = int(episodes) // (n["prompts"] * n["group"])
        ours = "= train.total_steps" if steps == n["total_steps"] else f"but train.total_steps is {n['total_steps']}"
        rows.append(("--total_episodes", f"{int(episodes):,} -> {int(episodes):,} // {n['prompts'] * n['group']} = "
                                         f"{steps:,} steps ({ours})"))
    if n["total_updates"] is not None:
        sched = cfg.optim.scheduler
        bug = "; --warm_up_steps ignored (warmup_override_bug)" if sched.warmup_override_bug else ""
        rows.append(("--warmup_ratio", f"{float(sched.warmup_ratio)} -> warmup {n['warmup']:,} of "
                                       f"{n['total_updates']:,} optimiser steps{bug}"))
    return rows


@SOURCE_VIEWS.register("openrlhf")
def _openrlhf(cfg, n: dict) -> list[tuple[str, str]]:
    """OpenRLHF train_ppo_ray: rollout_batch_size prompts x n_samples_per_prompt; train_batch_size samples per
    optimiser step; micro_train_batch_size per GPU (reference openrlhf.md)."""
    return [("--rollout_batch_size", f"{n['prompts']}"), ("--n_samples_per_prompt", f"{n['group']}"),
            ("--train_batch_size", f"{n['mini']}"), ("--micro_train_batch_size", f"{n['micro']}"),
            ("--max_epochs", f"{n['ppo_epochs']}")]


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
    from core.errors import InputError

    try:
        print("\n".join(explain(argv)))
    except InputError as e:
        sys.exit(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
