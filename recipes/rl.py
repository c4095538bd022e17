"""On-policy RL loop (GRPO family, REINFORCE++, RLOO, PPO with a critic): setup, train, save.

One RL step: sample ``prompts_per_step x group_size`` completions, score them with the verifier and
shape the scores, run the rollout-phase forwards (reference, old policy, critic: only those needed),
compute advantages, then take PPO-style optimiser steps over mini-batches of the rollout, each
accumulated from micro-batches; the critic steps alongside. Everything algorithmic is a registry
lookup in ``core/`` (docs/algorithms.md).

Data parallel under ``torchrun`` (``core/training/distributed.py``): every rank draws the same prompts and
keeps a contiguous slice of the step's group-major completions (TRL 1.16 ``process_slice``: a group may
span ranks), samples, scores and shapes its rows with its own RNG stream, and trains on them; what crosses
ranks is what the sources reduce: every rank's scores for the group baselines (TRL gathers the rewards
before the group mean/std; each rank keeps its rows' advantages), gradients (the engine), token counts of
an optimiser step (``token_mean_global``), global whitening, the adaptive KL's input, evaluation counts and
the logged metrics. Rank 0 writes.

Placement (``core/training/device.py``, ``core/training/backend.py``): one device per rank, resolved before any
model is built, holds the policy, reference, critic and every tensor of a step; ``model.dtype=bfloat16`` trains in
bf16 with fp32 master weights. The backend, built once from ``(zero, device, dtype)``, loads every model where it
belongs (under ZeRO-3 partitioned as it loads) and builds the engines; the loop never looks at the ZeRO stage.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

from core.algorithms import shaping
from core.algorithms.advantage import AdvantageInput, compute_advantages
from core.algorithms.kl_control import KLController
from core.config.frozen import FrozenConfig
from core.config.pipeline import prepare, recorded
from core.config.plan import RLPlan
from core.config.resume import check_resume_config, hydra_run_dir, write_config
from core.config.rows import checked_plan
from core.data import prompts as D
from core.models.loading import load_tokenizer, model_dir
from core.reporting.console import announced, log_step, start_summary
from core.reporting.metrics import MetricsWriter, PhaseTimer, peak_memory, reset_peak_memory
from core.reporting.results import append_row, command_line_overrides, write_summary
from core.rollout import Sampling, build_rollout, sampling_seed
from core.rollout.ahead import GenerationAhead, RolloutEngine
from core.training import distributed, numerics, preemption
from core.training.backend import Backend, FrozenModel, TrainEngine
from core.training.checkpoint import (AlreadyFinished, PriorRun, atomic_dir, load_training_state, prior_run,
                                     save_training_state, seed_everything)
from core.training.device import check_precision, resolve_device
from core.training.lifecycle import run_lifecycle
from recipes.rl_models import critic_optim, policy_start, setup_models
from recipes.rl_rewards import Scorers, evaluate, log_samples, reward_metrics, score, scorers
from recipes.rl_update import in_reward_kl, rollout_forwards, update

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass
class Data:
    """The prompts (:func:`_setup_data`): rows as loaded (prompt, answer, ...) and their token ids, after
    ``data.max_prompt_tokens``; the sampler that draws each step's training prompts."""

    train_rows: list[dict]
    train_ids: list[list[int]]
    eval_rows: list[dict]
    eval_ids: list[list[int]]
    sampler: D.PromptSampler


@dataclass
class Run:
    """What an RL run holds between steps; :func:`setup` builds it, one helper per component."""

    cfg: FrozenConfig
    plan: RLPlan
    run_dir: Path
    backend: Backend  # device, dtype and ZeRO placement: it loaded the models and built the engines
    tokenizer: PreTrainedTokenizerBase
    data: Data
    verifier: Scorers  # the training reward and the evaluation's, each with its accuracy term
    engine: TrainEngine  # the policy's optimiser engine
    critic: TrainEngine | None  # the value model's (advantage.critic), else None
    ref: FrozenModel | None  # the reference policy (kl.reference), else None
    rollout: RolloutEngine  # samples completions (rollout.engine)
    gen: GenerationAhead  # which weights generate which batch: rollout.generate_ahead (core/rollout/ahead.py)
    writer: MetricsWriter
    kl_ctl: KLController
    step: int = 0
    history: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def save_state(self, out_dir) -> None:
        """The engines' state for a checkpoint folder (``save_training_state``): the critic's in ``critic/``."""
        self.engine.save_state(out_dir)
        if self.critic is not None:
            (Path(out_dir) / "critic").mkdir(exist_ok=True)
            self.critic.save_state(Path(out_dir) / "critic")

    def state_bytes(self) -> int:
        """The bytes :meth:`save_state` writes (the free-space check before a first checkpoint)."""
        return self.engine.state_bytes() + (self.critic.state_bytes() if self.critic is not None else 0)

    def load_state(self, out_dir) -> None:
        self.engine.load_state(out_dir)
        if self.critic is not None:
            self.critic.load_state(Path(out_dir) / "critic")


def main(cfg, run_dir: str | None = None) -> float:
    """Setup, train, save; returns the final greedy held-out accuracy (the sweep objective).
    ``run_dir`` defaults to Hydra's run dir (given explicitly by tests that compose configs). A run dir
    that holds a finished run is not run again (``resume`` true or auto): its recorded objective returns. The run
    holds its run dir alone and ends the process group it started (core/training/lifecycle.py)."""
    with run_lifecycle(run_dir or hydra_run_dir()):
        try:
            run = setup(cfg, run_dir)
        except AlreadyFinished as done:
            log.info("%s already finished (%d steps); a larger train.total_steps extends it", done.summary["run_dir"],
                     done.summary["steps"])
            return float(done.summary["eval_after"])
        train(run)
        return save(run)


def setup(cfg, run_dir: str | None = None) -> Run:
    """The run's parts in order: config and plan, backend, data, run dir, models, rollout, logging, the resumed
    state. What bad input can fail fails before any model is built."""
    prepared = prepare(cfg)  # scaled, checked, planned and frozen (core/config/pipeline.py): before anything else
    cfg = prepared.frozen
    device = resolve_device(cfg.device)  # before any model: a device or precision it cannot run fails here
    backend = Backend(cfg.zero, device, check_precision(cfg.model.dtype, device))
    rank, _ = distributed.init(device, cfg.collective_timeout_s)
    seed_everything(cfg.seed, cfg.deterministic)
    train_rows, eval_rows = D.load_split(cfg.data, "train"), D.load_split(cfg.data, "eval")
    plan = checked_plan(cfg, prepared.plan, train_rows, eval_rows)  # what the rows decide, the reward's trial call
    path = model_dir(cfg.model)
    tokenizer = load_tokenizer(path)
    data = _setup_data(cfg, tokenizer, train_rows, eval_rows)
    plan = checked_plan(cfg, plan, data.train_rows, data.eval_rows, trial=False, tokenizer=tokenizer)  # rows kept
    verifier = scorers(cfg.verifier)
    run_dir, prior = _setup_run_dir(cfg, plan, run_dir)
    rows = {"training rows": len(data.train_rows), "held-out": len(data.eval_rows)}
    if distributed.is_main():
        log.info("%s", start_summary(cfg, plan, run_dir, rows, prior.checkpoint is not None))
    policy, critic, ref = setup_models(cfg, plan, backend, policy_start(cfg, plan, path, data, verifier.train, device))
    rollout = build_rollout(cfg.rollout.engine, policy.module, tokenizer, cfg.rollout)
    # the reference onto the device after the rollout engine: a colocated vLLM starts only if the GPU memory it
    # asks for (rollout.vllm.gpu_memory_utilization) is free
    ref = backend.frozen(ref) if ref is not None else None
    run = Run(cfg=cfg, plan=plan, run_dir=run_dir, backend=backend, tokenizer=tokenizer, data=data, verifier=verifier,
              engine=policy, critic=critic, ref=ref, rollout=rollout, gen=GenerationAhead(rollout),
              writer=_setup_logging(cfg, run_dir), kl_ctl=KLController(cfg.kl))
    if rank:  # each rank samples its own completions; rank 0 keeps the single-process stream
        seed_everything(cfg.seed + 1_000_003 * rank, cfg.deterministic)
    _resume(run, prior)
    return run


def _setup_data(cfg, tokenizer, train_rows: list[dict], eval_rows: list[dict]) -> Data:
    """The rows tokenized (``data.max_prompt_tokens`` drops longer prompts) and the training prompts' sampler."""
    train_rows, train_ids = D.tokenize_rows(train_rows, cfg.data, tokenizer)
    eval_rows, eval_ids = D.tokenize_rows(eval_rows, cfg.data, tokenizer)
    sampler = D.PromptSampler(len(train_rows), cfg.train.prompts_per_step, cfg.seed)
    return Data(train_rows, train_ids, eval_rows, eval_ids, sampler)


def _setup_run_dir(cfg, plan: RLPlan, run_dir: str | None) -> tuple[Path, PriorRun]:
    """Rank 0's run dir (Hydra's unless given) and what it holds, checked against ``resume`` before any model; the
    config written there, or checked against the one saved when a checkpoint resumes."""
    run_dir = Path(distributed.broadcast_object(str(run_dir or HydraConfig.get().runtime.output_dir)))
    prior = prior_run(run_dir, cfg.resume, plan.total_steps)
    if prior.checkpoint is not None:
        check_resume_config(run_dir, recorded(cfg, plan))
    elif distributed.is_main():
        write_config(run_dir, recorded(cfg, plan))
    distributed.barrier()
    return run_dir, prior


def _setup_logging(cfg, run_dir: Path) -> MetricsWriter:
    """``metrics.jsonl`` and ``samples.jsonl`` in the run dir, mirrored to TensorBoard and W&B as ``logger`` says;
    rank 0 writes."""
    return MetricsWriter(run_dir, tensorboard=cfg.logger.tensorboard, enabled=distributed.is_main(),
                         wandb=cfg.logger.wandb, config=cfg)


def _resume(run: Run, prior: PriorRun) -> None:
    """Engines, RNG streams, step, history, sampler, KL beta and the batch generated ahead from the checkpoint; the
    records cut back to what it saw, so the steps after it are logged once, by this run. Without a checkpoint
    (resume=auto, none yet) a killed attempt's records are moved aside (superseded/)."""
    if prior.checkpoint is None:
        run.writer.rewind(0, 0)
        return
    state = load_training_state(prior.checkpoint, run)
    run.step, run.history = state["step"], state["history"]
    run.gen.restore(state["local"], run.device)
    run.data.sampler.restore(state["sampler"])
    run.kl_ctl.beta = float(state["kl_beta"])
    run.writer.rewind(state["metrics_rows"], state["sample_rows"])
    if run.cfg.resume_allow_changes:  # the config's optimiser values, not the checkpoint's
        run.engine.retune(run.cfg.optim.optimizer)
        if run.critic is not None:
            run.critic.retune(critic_optim(run.cfg).optimizer)
    if distributed.is_main():
        write_config(run.run_dir, recorded(run.cfg, run.plan))  # the resumed config: only keys a resume may change


def train(run: Run) -> None:
    cfg, t, total = run.cfg, run.cfg.train, run.plan.total_steps
    if "eval_before" not in run.history:
        run.history["eval_before"] = announced_evaluation(run, "before RL")
        run.writer.log(0, {"eval/accuracy": run.history["eval_before"]})
    start = time.perf_counter()
    stop = preemption.install(run.run_dir)  # SIGUSR1, SIGTERM: finish the step, checkpoint, exit
    bar = tqdm(total=total, initial=run.step, desc=run.cfg.recipe_name,
               disable=not (cfg.logger.progress and distributed.is_main()), dynamic_ncols=True)
    while run.step < total:
        metrics = rl_step(run)
        run.step += 1
        if t.eval_every and run.step % t.eval_every == 0 and run.step < total:
            metrics["eval/accuracy"] = keep_best(run, evaluate(run))
        run.writer.log(run.step, metrics)
        if distributed.is_main():
            log_step(log, run.step, total, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}",
                        kl=f"{metrics.get('kl', 0.0):.4f}")
        bar.update()
        stopping = stop.agreed()  # every rank, once per step: a signal to any rank stops all after this step
        if stopping or t.checkpoint_every and (run.step % t.checkpoint_every == 0 or run.step == total):
            save_training_state(run.run_dir, run,
                                {"step": run.step, "history": run.history, "sampler": run.data.sampler.state(),
                                 "kl_beta": run.kl_ctl.beta, "metrics_rows": run.writer.rows,
                                 "sample_rows": run.writer.sample_rows}, local=run.gen.state(), keep=t.keep_checkpoints)
        if stopping:  # checkpointed: exit so the job is requeued (core/training/preemption.py)
            stop.exit(stopping, run.step)
    bar.close()
    run.history["train_seconds"] = run.history.get("train_seconds", 0.0) + time.perf_counter() - start
    run.history["eval_after"] = keep_best(run, announced_evaluation(run, "after RL"))
    run.writer.log(run.step, {"eval/accuracy": run.history["eval_after"]})


def rl_step(run: Run) -> dict:
    """One RL step: sample, score and shape, rollout-phase forwards, advantages, updates."""
    reset_peak_memory()  # memory/peak_mb is this step's
    cfg, G, timer = run.cfg, run.cfg.train.group_size, PhaseTimer()
    # Which prompts this step trains and which it starts (core/rollout/ahead.py): the batch generated one step ahead,
    # else this step's prompts, drawn and generated now; with rollout.generate_ahead, the next step's prompts start
    # on the current weights before this step trains (none after the last step).
    if run.gen.pending is None:
        idx, prompts = draw_prompts(run)
        run.gen.start(run.engine, run.step, idx, prompts, step_sampling(run, run.step), timer)
    idx, roll, made_by = run.gen.take(timer)  # the rows trained now, and the policy version that sampled them
    if cfg.rollout.generate_ahead and run.step + 1 < run.plan.total_steps:
        next_idx, next_prompts = draw_prompts(run)
        run.gen.start(run.engine, run.step, next_idx, next_prompts, step_sampling(run, run.step + 1), timer)
    rows = [run.data.train_rows[i] for i in idx]  # this rank's rows, group-major (a group may span ranks)
    with timer.phase("verify"):
        scored = score(run, roll, rows)
    raw, valid, stopped = scored.raw, scored.valid, roll.stopped  # [N] x3
    log_samples(run, rows, scored.texts, raw, valid, roll.finish_reason)
    # None rewards per train.shaping.none_reward, then the score-level shaping
    scores, mask = shaping.shape(raw, valid, roll.response_mask, stopped, cfg.rollout.max_new_tokens,
                                 cfg.train.shaping)  # [N], [N, R]
    with timer.phase("logprobs"):
        fw = rollout_forwards(run, roll)
    kl_reward, kl_metrics = in_reward_kl(run, fw, mask)  # [N, R] or None
    clip = cfg.train.shaping.reward_clip
    adv, ret = compute_advantages(AdvantageInput(scores, mask, G, fw.values, kl_reward,
                                                 tuple(clip) if clip else None), cfg.advantage)  # [N, R] x2
    guard = partial(numerics.guard, run.step + 1, cfg.train.on_nonfinite, run.run_dir,  # NaN reward: missing
                    records=lambda: numerics.completion_records(rows, scored.texts, raw, valid, adv, mask))
    bad = guard({"reward": raw, "advantage": adv}, {})  # a bad rollout takes no optimiser step
    with timer.phase("update"):
        upd = {} if bad else distributed.mean_metrics(update(run, roll, mask, adv, ret, fw))
    bad = bad or guard({}, {k: upd[k] for k in ("loss", "grad_norm", "value/loss", "value/grad_norm") if k in upd})
    n_global = roll.input_ids.shape[0] * distributed.world()
    beta = run.kl_ctl.beta if bad else run.kl_ctl.update(kl_metrics.get("kl_reward", upd.get("kl", 0.0)), n_global)
    # the whole step's rows, every rank's, for the logged statistics
    lengths, stopped = (distributed.gather_rows(x.float()) for x in (roll.response_lengths, stopped))
    tokens = distributed.all_sum(torch.stack([roll.response_mask.sum(), roll.attention_mask.sum()]).double())
    return {
        **reward_metrics(scored, scores),
        "length/mean": lengths.mean().item(), "length/max": lengths.max().item(),
        "length/truncated_frac": 1.0 - stopped.float().mean().item(), "kl/beta": beta,
        "tokens/generated": tokens[0].item(), "tokens/total": tokens[1].item(), **kl_metrics, **upd,
        "rollout/policy_lag": run.step - made_by,  # versions between the weights trained and those that sampled
        **distributed.mean_metrics(timer.pop(), peak_memory()), **numerics.skip_metrics(cfg.train.on_nonfinite, bad),
    }


def step_sampling(run: Run, step: int) -> Sampling:
    """How the batch RL step ``step`` (0-based) trains on is sampled: ``rollout``'s parameters; a seed from the run's
    seed and that step, and this rank's rows numbered among the step's (:func:`draw_prompts`), so an engine that seeds
    each row (vLLM) draws the same on every rank of an engine and a resumed run samples what the uninterrupted one
    would (docs/vllm.md, "Sampling seeds"); the sampler's log-probs only when the loss reads them."""
    first = distributed.own_rows(run.plan.samples_per_step).start
    return Sampling.from_cfg(run.cfg.rollout, seed=sampling_seed(run.cfg.seed, "rollout", step), first_row=first,
                             logprobs=run.plan.rollout_logprobs)


def draw_prompts(run: Run) -> tuple[list[int], list[list[int]]]:
    """The next RL step's rows for this rank: their prompt indices and token ids, one per completion. The step's
    rows are group-major (G per prompt) and each rank takes its contiguous slice, so a group may span ranks (TRL's
    ``process_slice``; the group statistics gather them: core/algorithms/advantage.py)."""
    G = run.cfg.train.group_size
    step_rows = [i for i in run.data.sampler.next() for _ in range(G)]
    idx = step_rows[distributed.own_rows(len(step_rows))]
    return idx, [run.data.train_ids[i] for i in idx]


def announced_evaluation(run: Run, when: str) -> float:
    """:func:`evaluate`, announced in the log, then its accuracy and time."""
    n = run.cfg.train.eval_prompts or len(run.data.eval_rows)
    with announced(log, f"greedy evaluation on {min(n, len(run.data.eval_rows))} held-out prompts ({when})") as said:
        accuracy = evaluate(run)
        said.append(f"accuracy {accuracy:.3f}")
    return accuracy


def keep_best(run: Run, accuracy: float) -> float:
    """With ``train.keep_best``, the policy of the best held-out accuracy so far (first of equals) saved to
    ``best/`` (atomic) and its step recorded, so the row reports it beside the last (SimpleRL-Zoo released step 90
    of ~100, Open-Instruct an intermediate checkpoint). Returns ``accuracy``."""
    best = run.history.get("best")
    if run.cfg.train.keep_best and not math.isnan(accuracy) and (best is None or accuracy > best["accuracy"]):
        with atomic_dir(run.run_dir / "best") as tmp:  # collective: ZeRO-3 gathers, rank 0 writes
            run.engine.save_pretrained(tmp, run.tokenizer)
        run.history["best"] = {"step": run.step, "accuracy": accuracy}
    return accuracy


def save(run: Run) -> float:
    """Final Hugging Face checkpoint (atomic), one row in the results table, then ``summary.json``: the
    mark of a finished run (a kill before it resumes and finishes; the row is not appended twice)."""
    with atomic_dir(run.run_dir / "model") as tmp:  # collective: ZeRO-3 gathers, rank 0 writes
        run.engine.save_pretrained(tmp, run.tokenizer)
    run.writer.close()
    h, cfg = run.history, run.cfg
    if not distributed.is_main():
        return h["eval_after"] if not math.isnan(h["eval_after"]) else 0.0
    row = {
        "recipe": cfg.recipe_name, "run_dir": str(run.run_dir), "seed": cfg.seed, "steps": run.step,
        "scale": cfg.scale.name, "eval_before": h["eval_before"], "eval_after": h["eval_after"],
        "train_seconds": round(h["train_seconds"], 2), "overrides": command_line_overrides(),
        **({"best_step": h["best"]["step"], "eval_best": h["best"]["accuracy"]} if "best" in h else {}),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    append_row(Path(cfg.paths.results_dir), row)
    write_summary(run.run_dir, row)
    log.info("greedy held-out accuracy (correct by %s): before RL %.3f, after RL %.3f (%d steps, %.1f s); run dir %s",
             run.verifier.eval.accuracy_name, h["eval_before"], h["eval_after"], run.step, h["train_seconds"],
             run.run_dir)
    return h["eval_after"] if not math.isnan(h["eval_after"]) else 0.0
