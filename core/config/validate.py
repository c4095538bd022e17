"""The check step of the config pipeline (core/config/pipeline.py ``prepare``), run once before any model is built:
the schema (types, ranges, unknown keys), inputs (model paths, the results dir), the layout (core/config/layout.py),
batch arithmetic and incompatible combinations.

Every problem found is collected and raised together (:func:`refuse`), each naming the keys and values that clash.
"""
from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

from omegaconf import OmegaConf

from core.algorithms.advantage import ADVANTAGES
from core.algorithms.kl_control import KL_CONTROLLERS
from core.config.checking import check_schema
from core.config.layout import layout_problems
from core.config.scale import command_line_keys
from core.config.tokens import token_id_problems
from core.config.warm_start import decide
from core.errors import InputError
from core.models.loading import flash_attention_problem, model_source_problem
from core.rollout import ROLLOUT_ENGINES
from core.training.engine import deepspeed_version_problem
from core.training.optim import CPU_ADAM_MODES, SCHEDULES
from core.registry import Registry
from verifiers import VERIFIERS


class ConfigError(InputError):
    """A config that cannot run; the message lists every problem found."""


def problems(cfg, world: int, packages: bool = True) -> list[str]:
    """Every reason the scaled config ``cfg`` cannot run in a world of ``world`` learner ranks, each owned by what
    it checks: every key against its schema (unknown keys, ranges: core/config/checking.py), the layout
    (core/config/layout.py) and the loop's batches split over its learners (:data:`BATCH_SPLITS`), the sharding,
    optimiser, schedule (its entry's check in core/training/optim.py ``SCHEDULES``) and models both loops share, a
    writable results table, the local data files, and the loop's own settings (:data:`LOOP_CHECKS`). ``packages=False``
    leaves out what only the machine that runs it must hold: the gpu extra the config names (vLLM, flash-attn) and the
    data files (``recipes.explain`` on a laptop)."""
    errors = check_schema(cfg)
    bad = {re.match(r"[\w.]+", e).group(0) for e in errors}  # keys out of range: the checks that divide by them wait
    if not any(k.startswith("layout.") for k in bad):
        errors += layout_problems(cfg, world)
        if not bad & {f"train.{k}" for k in BATCH_SPLITS.meta(cfg.loop)["keys"]}:
            errors += BATCH_SPLITS.get(cfg.loop)(cfg.train, cfg.layout.learner_gpus)
    errors += _zero_problems(cfg.zero, cfg.optim.optimizer)
    if packages and int(cfg.zero.stage) > 0 and (problem := deepspeed_version_problem()):
        errors.append(f"zero.stage={cfg.zero.stage}: {problem}")
    errors += _optimizer_problems(cfg.optim.optimizer)
    errors += SCHEDULES.problems(cfg.optim.scheduler.name, cfg.optim.scheduler)
    errors += _model_problems(cfg, packages)
    problem = _unwritable(Path(str(cfg.paths.results_dir)))
    if problem:
        errors.append(f"paths.results_dir={cfg.paths.results_dir}: {problem}; the results table and run dirs "
                      f"are written there")
    if packages:
        errors += _data_file_problems(cfg.data)
    if cfg.loop in LOOP_CHECKS:
        errors += LOOP_CHECKS.get(cfg.loop)(cfg, packages)
    return errors


def _data_file_problems(data) -> list[str]:
    """Each local data file of one's own the config names and its source reads (``data.path``, ``data.eval_path``)
    exists. Files under the shared data dir (``paths.data_dir``: the recipes' own, often mounted only where runs
    go, and absent from a fresh clone) are checked as they are read, still before any model
    (core/data/prompts.py ``read_rows``), like the rows themselves."""
    from core import paths

    reads = {"path": data.source in ("file", "code_stdio"),
             "eval_path": data.get("eval", "source") == "source" and  # pairs: a held-out source of their own
                          data.get("eval_source", data.source) in ("file", "code_stdio")}
    shared = paths.data_dir()
    return [f"data.{key}={data[key]}: data file not found: {f}" for key, read in reads.items()
            if read and data.get(key) and not (f := paths.resolve(data[key])).exists()
            and not f.is_relative_to(shared)]


def refuse(errors: list[str]) -> None:
    """Raise :class:`ConfigError` listing ``errors``, if any."""
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


def _zero_problems(zero, opt) -> list[str]:
    """Settings DeepSpeed honours only under some ZeRO stages."""
    errors = []
    for key in ("offload_param", "offload_reference"):
        if zero[key] and zero.stage != 3:
            errors.append(f"zero.{key}=true with zero.stage={zero.stage}: parameters are partitioned (and so "
                          f"offloadable) under ZeRO-3 only; use zero=stage3, or zero.offload_optimizer=true (optimiser "
                          f"state in CPU memory) with zero=stage1|stage2")
    errors += _offload_problems(zero, opt)
    for key in ("grad_accum_dtype", "communication_data_type"):
        if zero[key] is not None and zero.stage == 0:
            errors.append(f"zero.{key}={zero[key]} with zero.stage=0: it is a DeepSpeed setting and stage 0 trains "
                          f"with the plain torch engine; use zero=stage1|stage2|stage3 or zero.{key}=null")
    return errors


def _model_problems(cfg, packages: bool) -> list[str]:
    """The model sources exist, the attention kernel runs in the model's dtype (and transformers finds it), tiny sizes
    are positive."""
    errors = []
    for key, value in (("model.name_or_path", cfg.model.name_or_path),
                       ("advantage.critic.init_from", OmegaConf.select(cfg, "advantage.critic.init_from"))):
        problem = model_source_problem(key, value, tokenizer=key == "model.name_or_path")
        if problem:
            errors.append(problem)
    if not any(e.startswith(("model.", "scale")) for e in errors):  # a vocabulary to check against
        errors += token_id_problems(cfg, command_line_keys())
    attn = cfg.model.attn_implementation
    if attn.startswith("flash_attention") and cfg.model.dtype == "float32":
        errors.append(f"model.attn_implementation={attn} with model.dtype=float32: flash-attn runs in float16 or "
                      f"bfloat16 only; use model.dtype=bfloat16 or model.attn_implementation=sdpa")
    if packages and (problem := flash_attention_problem(attn)):  # as transformers will ask it
        errors.append(problem)
    for key, value in (cfg.model.tiny or {}).items():
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            errors.append(f"model.tiny.{key}={value}: expected a positive size")
    return errors


def _optimizer_problems(opt) -> list[str]:
    """``optim.optimizer._target_`` must be a class, and every non-null key one its constructor takes."""
    from hydra.utils import get_class

    try:
        target = get_class(opt._target_)
    except Exception as e:  # Hydra wraps import failures in several types
        return [f"optim.optimizer._target_={opt._target_!r}: not an importable class ({e})"]
    params = inspect.signature(target).parameters
    taken = [k for k, v in opt.items() if v is not None and not k.startswith("_") and k not in params]
    return [f"optim.optimizer.{k}={opt[k]!r}: {opt._target_} takes no {k!r} (it takes "
            f"{', '.join(p for p in params if p != 'params')}); set it to null" for k in taken]


def _offload_problems(zero, opt) -> list[str]:
    """``zero.offload_optimizer`` needs a DeepSpeed stage (the plain torch engine has nothing to offload) and an
    optimiser DeepSpeed's CPU Adam computes (core/training/optim.py ``cpu_adam``)."""
    if not zero.offload_optimizer:
        return []
    if zero.stage == 0:
        return [f"zero.offload_optimizer=true with zero.stage=0: ZeRO-Offload is a DeepSpeed setting and stage 0 "
                f"trains with the plain torch engine; use zero=stage1|stage2|stage3 or zero.offload_optimizer=false"]
    if opt._target_ not in CPU_ADAM_MODES:
        return [f"zero.offload_optimizer=true with optim.optimizer._target_={opt._target_}: the offloaded optimiser "
                f"steps with DeepSpeed's CPU Adam, which computes only {' or '.join(CPU_ADAM_MODES)}; use one of "
                f"them or zero.offload_optimizer=false"]
    return []


def _unwritable(path: Path) -> str | None:
    """Why nothing can be written at ``path`` (its nearest existing ancestor must be a writable dir)."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    return None if os.access(probe, os.W_OK | os.X_OK) else f"{probe} is not writable by this user"


def _check_names(cfg, errors: list[str]) -> None:
    """Option values an estimator declares at registration (the schema checks every registry name)."""
    if cfg.advantage.name in ADVANTAGES:
        for key, allowed in ADVANTAGES.meta(cfg.advantage.name).get("choices", {}).items():
            if key not in cfg.advantage:
                errors.append(f"advantage.name={cfg.advantage.name} needs advantage.{key}, which this advantage "
                              f"node lacks: use the config option advantage={cfg.advantage.name}")
            elif cfg.advantage[key] not in allowed:
                errors.append(f"advantage.{key}={cfg.advantage[key]!r} with advantage.name={cfg.advantage.name}; "
                              f"choose one of {sorted(allowed)}")


def _check_critic(cfg, errors: list[str]) -> None:
    needs = ADVANTAGES.meta(cfg.advantage.name).get("needs_values", False)
    has = "critic" in cfg.advantage  # only the estimators with a value model have the node
    if needs and not has:
        errors.append(f"advantage.name={cfg.advantage.name} needs a value model but advantage.critic is not set "
                      f"(use the config option advantage={cfg.advantage.name}, which defines it)")
    if has and not needs:
        errors.append(f"advantage.critic is set but advantage.name={cfg.advantage.name} does not use values "
                      f"(only {[n for n in ADVANTAGES.names() if ADVANTAGES.meta(n).get('needs_values')]} do)")


def _check_kl(cfg, errors: list[str]) -> None:
    kl, coef = cfg.kl, float(cfg.kl.coef)
    ref = kl.reference
    if ref is True and coef == 0:
        errors.append(f"kl.reference=true with kl.coef=0 (kl.placement={kl.placement}): a reference model would "
                      f"be built but never used; set kl.coef > 0 or kl.reference=auto")
    if ref is False and coef > 0:
        errors.append(f"kl.reference=false with kl.coef={coef}: the KL penalty needs the reference model")
    controller = kl.controller
    if controller in KL_CONTROLLERS and KL_CONTROLLERS.meta(controller).get("needs_target"):
        if kl.placement != "reward":
            errors.append(f"kl.controller={controller} with kl.placement={kl.placement}: the adaptive controller "
                          f"tunes the in-reward penalty (OpenRLHF, veRL); use kl.placement=reward")
        if kl.target is None:
            errors.append(f"kl.controller={controller} needs kl.target (a KL > 0 the controller steers to)")


def _check_loss(cfg, errors: list[str]) -> None:
    isc = cfg.loss.is_correction
    if isc.mode != "none" and isc.high is None:
        errors.append(f"loss.is_correction.mode={isc.mode} needs loss.is_correction.high")


def _check_verifier(cfg, errors: list[str]) -> None:
    """The verifier and the greedy evaluation's (optional), each with its options and the term its accuracy counts
    (``verifier.accuracy_term``; verifiers/correctness.py)."""
    v = cfg.verifier
    for key, kwargs in (("name", "kwargs"), ("eval_name", "eval_kwargs")):
        if v.get(key):  # the accuracy term is the training verifier's, and an evaluation's that is a weighted sum
            term = v.get("accuracy_term") if key == "name" or v[key] == "weighted" else None
            errors += VERIFIERS.problems(v[key], v.get(kwargs) or {}, f"verifier.{key}", f"verifier.{kwargs}",
                                         "verifier.accuracy_term", term)


def reward_trial_problems(v, train: list[dict], held: list[dict]) -> list[str]:
    """Run once the rows are read (core/config/rows.py): the training reward's functions of one's own tried on the
    first training row, and the evaluation's (``verifier.eval_name``, else the training reward when the held-out rows
    have other columns) on the first held-out row (verifiers/trial.py)."""
    found = []
    if train:
        found += VERIFIERS.problems(v.name, v.kwargs or {}, "verifier.name", "verifier.kwargs", sample=train[0])
    if held and (v.get("eval_name") or not train or set(held[0]) != set(train[0])):  # else the same call again
        key, kwargs = ("eval_name", "eval_kwargs") if v.get("eval_name") else ("name", "kwargs")
        found += VERIFIERS.problems(v[key], v.get(kwargs) or {}, f"verifier.{key}", f"verifier.{kwargs}",
                                    sample=held[0])
    return found


def _check_holdout(data, errors: list[str]) -> None:
    """Where the held-out rows come from: a file (``data.eval_path``) or rows of the training file held out
    (``data.eval_holdout``), not both; a file source needs one of them."""
    holdout = data.eval_holdout
    if holdout is not None and data.eval_path:
        errors.append(f"data.eval_holdout={holdout:g} with data.eval_path={data.eval_path}: the held-out rows come from "
                      f"the file or are held out of the training rows; set one of them (the other null)")
    elif holdout is not None and holdout >= 1 and holdout != int(holdout):
        errors.append(f"data.eval_holdout={holdout:g}: expected a whole number of rows (>= 1) or a fraction (< 1)")
    elif holdout is None and data.source == "file" and not data.eval_path:
        errors.append("data.eval_path is not set: data.source=file evaluates on a held-out file; set data.eval_path="
                      "FILE, or hold rows of data.path out with data.eval_holdout=N (or a fraction such as 0.1)")


def _check_placement(cfg, errors: list[str], packages: bool = True) -> None:
    """Settings that the device and the sharding cannot honour; the rollout engine's own checks
    (core/rollout/__init__.py)."""
    errors += ROLLOUT_ENGINES.problems(cfg.rollout.engine, cfg, packages=packages)


def _check_warm_start(cfg, errors: list[str]) -> None:
    """A warm start asked for with no steps to run, or one that would run under ZeRO-3 (whether it runs:
    core/config/warm_start.py, from the keys set on the command line)."""
    ws = cfg.train.warm_start
    if ws.enabled is True and int(ws.steps) == 0:
        errors.append("train.warm_start.enabled=true with train.warm_start.steps=0: no supervised steps to run; set "
                      "train.warm_start.steps (its budget: it stops earlier at train.warm_start.target_accuracy)")
    if int(cfg.zero.stage) == 3 and decide(ws, command_line_keys()).runs:
        errors.append(f"train.warm_start.steps={ws.steps} with zero.stage=3: the warm start trains a full copy of the "
                      f"model in one process before ZeRO-3 shards it; start from a checkpoint that needs none "
                      f"(train.warm_start.enabled=false), or warm-start under zero=none|stage1|stage2")


# How each loop's batches divide over its ranks (``loop`` -> fn(train cfg, learners) -> problems): the one place
# for that arithmetic, run by :func:`problems` with the layout's learner count (core/config/plan.py derives the
# per-rank sizes from the same division).
BATCH_SPLITS: Registry = Registry("batch split")


@BATCH_SPLITS.register("rl", keys=("prompts_per_step", "group_size", "mini_batch_size", "micro_batch_size"))
def rl_batch_problems(t, world: int) -> list[str]:
    """An RL step's completions split into whole mini-batches; each rank takes an equal contiguous slice of the
    step's group-major completions, as TRL 1.16 splits them (``process_slice``; a group may span ranks, its
    scores are gathered for the baseline), and an equal share of every mini-batch in whole micro-batches
    (recipes/rl.py). Only the completion count has to divide by the ranks, not the prompt count. When a size does
    not divide, the last problem names sizes that fit all three divisions at once (:func:`_fitting_sizes`)."""
    samples, errors = t.prompts_per_step * t.group_size, []
    completions = f"train.prompts_per_step x train.group_size = {t.prompts_per_step} x {t.group_size} = {samples}"
    if samples % t.mini_batch_size:
        errors.append(f"{completions} completions is not divisible by train.mini_batch_size={t.mini_batch_size}")
    if samples % world:
        errors.append(f"{completions} completions is not divisible by the world size {world}: each rank takes an "
                      f"equal slice of them")
    if t.mini_batch_size % (t.micro_batch_size * world):
        errors.append(f"train.mini_batch_size={t.mini_batch_size} is not divisible by train.micro_batch_size x "
                      f"world size = {t.micro_batch_size} x {world}")
    fit = _fitting_sizes(t, world) if errors and not samples % world else None
    if fit:
        errors.append(f"sizes that divide together with train.prompts_per_step={t.prompts_per_step} and "
                      f"train.group_size={t.group_size} in a world of {world}: {fit}")
    return errors


def _fitting_sizes(t, world: int) -> str:
    """The overrides that make an RL step's ``samples`` completions split: the largest mini-batch up to
    ``train.mini_batch_size`` that divides them and is a multiple of the world size, and the largest micro-batch up
    to ``train.micro_batch_size`` whose ``x world`` divides that mini-batch (``samples % world == 0``, so 1 fits)."""
    samples = t.prompts_per_step * t.group_size
    mini = next(m for m in range(min(t.mini_batch_size, samples), 0, -1) if not samples % m and not m % world)
    micro = next(u for u in range(min(t.micro_batch_size, mini // world), 0, -1) if not mini % (u * world))
    return " ".join(f"train.{k}={v}" for k, v in (("mini_batch_size", mini), ("micro_batch_size", micro))
                    if v != t[k])


@BATCH_SPLITS.register("rm", keys=("batch_size", "micro_batch_size"))
def rm_batch_problems(t, world: int) -> list[str]:
    """A reward-model step of ``batch_size`` pairs splits into whole micro-batches on every rank (recipes/rm.py)."""
    batch, micro = t.batch_size, t.micro_batch_size
    if batch % (micro * world):
        return [f"train.batch_size={batch} is not a multiple of micro_batch_size x world = {micro} x {world}"]
    return []


# Each loop's own settings (``loop`` -> fn(cfg, packages) -> problems), checked by :func:`problems` after the
# settings every loop shares.
LOOP_CHECKS: Registry = Registry("loop checks")


@LOOP_CHECKS.register("rm")
def rm_problems(cfg, packages: bool = True) -> list[str]:
    """The pair length filters: a prompt limit and Open-Instruct's release filter decide which pairs to drop, so they
    need ``data.too_long=drop`` (truncation keeps every pair; core/data/preferences.py ``too_long``)."""
    d = cfg.data
    if d.too_long == "drop":
        return []
    return [f"data.{k}={d[k]} with data.too_long=truncate: it drops pairs, which truncation never does; set "
            f"data.too_long=drop or data.{k}={null}" for k, null in (("max_prompt_tokens", "null"),
                                                                     ("length_filter_bug", "false"))
            if d[k] not in (None, False)]


@LOOP_CHECKS.register("rl")
def rl_problems(cfg, packages: bool = True) -> list[str]:
    """How the RL run ends, the estimator's options and group size, the KL, loss and placement settings, the
    verifiers; the batch sizes are :func:`rl_batch_problems`' (their ranges the schema's)."""
    t, errors = cfg.train, []
    if (t.total_steps is None) == (t.epochs is None):
        errors.append(f"train.total_steps={t.total_steps} and train.epochs={t.epochs}: set exactly one (epochs "
                      f"derives the RL steps from the training rows, as TRL num_train_epochs and veRL total_epochs)")
    _check_names(cfg, errors)
    _check_kl(cfg, errors)
    _check_loss(cfg, errors)
    _check_placement(cfg, errors, packages)
    _check_warm_start(cfg, errors)
    _check_verifier(cfg, errors)
    _check_holdout(cfg.data, errors)
    known = cfg.advantage.name in ADVANTAGES
    if known:
        _check_critic(cfg, errors)
    min_group = ADVANTAGES.meta(cfg.advantage.name).get("min_group_size", 1) if known else 1
    if t.group_size < min_group:
        takes = [n for n in ADVANTAGES.names() if ADVANTAGES.meta(n).get("min_group_size", 1) <= t.group_size]
        errors.append(f"train.group_size={t.group_size}: advantage.name={cfg.advantage.name} compares "
                      f"completions of one prompt and needs group_size >= {min_group}; estimators that take "
                      f"{t.group_size}: {', '.join(f'advantage={n}' for n in takes) or 'none'}")
    if t.shaping.none_reward == "exclude" and known and not ADVANTAGES.meta(cfg.advantage.name).get("excludes_nan"):
        errors.append(f"train.shaping.none_reward=exclude leaves unscored samples out of group statistics, which "
                      f"advantage.name={cfg.advantage.name} does not support; use one of "
                      f"{[n for n in ADVANTAGES.names() if ADVANTAGES.meta(n).get('excludes_nan')]} or "
                      f"none_reward=mask|zero")
    return errors
