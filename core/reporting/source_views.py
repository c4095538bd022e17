"""How ``python -m recipes.explain`` states a recipe's batch arithmetic in the flags of the framework it reproduces
(``source.name``): one view per framework, each ``fn(cfg, numbers) -> [(source flag, value and how it follows
from ours)]``, ``numbers`` being recipes/explain.py ``numbers`` (every derived figure of an RL recipe). The views live
in core so that the schema's check of ``source.name`` (core/config/schema.py) names no recipe module.
"""
from __future__ import annotations

from core.registry import Registry

SOURCE_VIEWS: Registry = Registry("source view")


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
            rows.append(("steps run", f"{steps} = {full} full epochs of {per} + {rest} steps ({n['epochs']:.2f} "
                                      f"epochs, about {n['views']:.0f} views of each example at rollout.n "
                                      f"{n['group']})"))
    return rows


def _rows_before_filters(cfg) -> int | None:
    """Training rows before ``data.max_prompt_chars`` (None when the data cannot be read here); a hub dataset's
    published count (``data.published_rows``), which recipes.explain does not download to recount."""
    from omegaconf import OmegaConf

    from core.data import prompts as D

    if cfg.data.source == "hub":
        return cfg.data.published_rows
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
