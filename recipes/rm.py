"""Pairwise reward-model loop (Bradley-Terry): setup, train, save.

One optimiser step takes ``train.batch_size`` pairs, split into micro-batches of
``train.micro_batch_size`` pairs per rank; each micro-batch runs chosen and rejected through one
forward pass, reads the scalar head at each sequence's last real token and adds
``-log sigmoid(r_c - r_r - margin)``. Held-out pairs are scored before, every ``eval_every`` steps
and after training; the final eval rewards' mean/std are saved with the model so RL can normalise.

Data parallel under ``torchrun`` as the RL loop (``recipes/rl.py``): each rank takes its share of a step's pairs,
gradients and the logged step metrics are averaged over ranks, every rank scores all held-out pairs (so the
evaluation equals one process's); rank 0 decides the run dir and alone writes config, records, row and summary.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

from core.config.frozen import FrozenConfig
from core.config.pipeline import prepare, recorded
from core.config.plan import RMPlan
from core.config.resume import check_resume_config, hydra_run_dir, write_config
from core.data import preferences as PD
from core.data.prompts import PromptSampler
from core.models import reward_model as RM
from core.models.loading import for_training, load_tokenizer, model_dir
from core.reporting.console import announced, log_step, start_summary
from core.reporting.metrics import MetricsWriter, PhaseTimer, peak_memory, reset_peak_memory, to_floats
from core.reporting.results import append_row, command_line_overrides, write_summary
from core.training import distributed, numerics, preemption
from core.training.backend import Backend, TrainEngine
from core.training.checkpoint import (AlreadyFinished, PriorRun, atomic_dir, load_training_state, prior_run,
                                     save_training_state, seed_everything)
from core.training.device import check_precision, resolve_device
from core.training.lifecycle import run_lifecycle

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


log = logging.getLogger(__name__)


@dataclass
class Data:
    """The preference pairs (:func:`_setup_data`), tokenized and length-filtered; why rows were dropped, per split;
    the sampler that draws each step's pairs."""

    train_pairs: list[dict]
    eval_pairs: list[dict]
    stats: dict[str, PD.PairStats]  # "train", "eval"
    sampler: PromptSampler


@dataclass
class Run:
    """What a reward-model run holds between steps; :func:`setup` builds it, one helper per component."""

    cfg: FrozenConfig
    plan: RMPlan
    run_dir: Path
    backend: Backend  # device, dtype and ZeRO placement: it loaded the model and built the engine
    tokenizer: PreTrainedTokenizerBase
    data: Data
    engine: TrainEngine
    writer: MetricsWriter
    step: int = 0
    history: dict = field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        return self.backend.device


def main(cfg) -> float:
    """Setup, train, save; returns the final held-out pair accuracy (the sweep objective). A run dir that
    holds a finished run is not run again (``resume`` true or auto): its recorded objective returns. The run holds its
    run dir alone and ends the process group it started (core/training/lifecycle.py)."""
    with run_lifecycle(hydra_run_dir()):
        try:
            run = setup(cfg)
        except AlreadyFinished as done:
            log.info("%s already finished (%d steps); nothing to resume", done.summary["run_dir"],
                     done.summary["steps"])
            return float(done.summary.get("eval_after") or 0.0)
        train(run)
        return save(run)


def setup(cfg) -> Run:
    """The run's parts in order: config and plan, backend, data, run dir, model, logging, the resumed state. What
    bad input can fail fails before any model is built."""
    prepared = prepare(cfg)  # scaled, checked, planned and frozen (core/config/pipeline.py): before anything else
    cfg = prepared.frozen
    device = resolve_device(cfg.device)  # before any model: a device or precision it cannot run fails here
    backend = Backend(cfg.zero, device, check_precision(cfg.model.dtype, device))
    distributed.init(device, cfg.collective_timeout_s)
    seed_everything(cfg.seed, cfg.deterministic)
    train_rows, eval_rows, stats = PD.load_pairs(cfg.data)  # text checks: before any model
    prepared.plan.for_rows(len(train_rows))  # the pairs make a step before the length filters: before any model
    if cfg.train.lora.rank > 0:
        RM.check_lora_targets(cfg.train.lora, RM.model_skeleton(cfg.model))  # meta device, no weights
    run_dir, prior = _setup_run_dir(cfg, prepared.plan)
    path = model_dir(cfg.model)
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = cfg.train.padding_side
    PD.force_chat_template(tokenizer, cfg.data)
    data = _setup_data(cfg, tokenizer, train_rows, eval_rows, stats)
    plan = prepared.plan.for_rows(len(data.train_pairs))  # again: length filters may have dropped pairs
    if distributed.is_main():
        rows = {"training pairs": len(data.train_pairs), "held-out": len(data.eval_pairs)}
        log.info("%s", start_summary(cfg, plan, run_dir, rows, prior.checkpoint is not None))
    run = Run(cfg=cfg, plan=plan, run_dir=run_dir, backend=backend, tokenizer=tokenizer, data=data,
              engine=_setup_model(cfg, plan, backend, path, tokenizer), writer=_setup_logging(cfg, run_dir))
    _resume(run, prior)
    return run


def _setup_run_dir(cfg, plan: RMPlan) -> tuple[Path, PriorRun]:
    """Rank 0's run dir (Hydra's) and what it holds, checked against ``resume`` before any model; the config written
    there, or checked against the one saved when a checkpoint resumes."""
    run_dir = Path(distributed.broadcast_object(str(HydraConfig.get().runtime.output_dir)))  # rank 0's
    prior = prior_run(run_dir, cfg.resume)
    if prior.checkpoint is not None:
        check_resume_config(run_dir, recorded(cfg, plan))
    elif distributed.is_main():
        write_config(run_dir, recorded(cfg, plan))
    distributed.barrier()  # the config is written before any rank reads the dir again
    return run_dir, prior


def _setup_data(cfg, tokenizer, train_rows: list[dict], eval_rows: list[dict], stats: dict) -> Data:
    """The pairs tokenized and cut or dropped at ``train.max_len`` (counted in ``stats``), and the pair sampler."""
    max_len = cfg.train.max_len
    train_pairs = PD.tokenize_pairs(train_rows, tokenizer, cfg.data, max_len, stats["train"])
    eval_pairs = PD.tokenize_pairs(eval_rows, tokenizer, cfg.data, max_len, stats["eval"])
    sampler = PromptSampler(len(train_pairs), cfg.train.batch_size, cfg.seed)
    return Data(train_pairs, eval_pairs, stats, sampler)


def _setup_model(cfg, plan: RMPlan, backend: Backend, path: str, tokenizer) -> TrainEngine:
    """The reward model, built where the backend places it (ZeRO-3: partitioned as it loads), in its engine."""
    with announced(log, f"building the reward model from {path}"), backend.placed():
        model = build_model(path, cfg, tokenizer, backend.writable)
    return backend.train_engine(model, cfg.optim, plan.total_steps, plan.grad_accum, cfg.train.micro_batch_size)


def build_model(path: str, cfg, tokenizer, writable=contextlib.nullcontext):
    """The scalar-head model in train mode (gradient checkpointing runs only there), dropout off per
    ``train.disable_dropout``, LoRA-wrapped when ``train.lora.rank > 0``. ``writable``: the backend's, under which a
    fresh head is initialised (:meth:`core.training.backend.Backend.writable`); whole models need none."""
    model = RM.load_reward_model(path, cfg.model, cfg.train.head_init, tokenizer.pad_token_id, writable)
    model = for_training(model, cfg.train.disable_dropout)  # before LoRA, which keeps its own lora.dropout
    if cfg.train.lora.rank > 0:
        model = RM.apply_lora(model, cfg.train.lora)
    return model


def _setup_logging(cfg, run_dir: Path) -> MetricsWriter:
    """``metrics.jsonl`` in the run dir, mirrored to TensorBoard and W&B as ``logger`` says; rank 0 writes."""
    return MetricsWriter(run_dir, tensorboard=cfg.logger.tensorboard, enabled=distributed.is_main(),
                         wandb=cfg.logger.wandb, config=cfg)


def _resume(run: Run, prior: PriorRun) -> None:
    """Engine, RNG streams, step, history and sampler from the checkpoint; the records cut back to what it saw.
    Without a checkpoint (resume=auto, none yet) a killed attempt's records are moved aside (superseded/)."""
    if prior.checkpoint is None:
        run.writer.rewind(0)
        return
    state = load_training_state(prior.checkpoint, run.engine)
    run.step, run.history = state["step"], state["history"]
    run.data.sampler.restore(state["sampler"])
    run.writer.rewind(state["metrics_rows"])
    if run.cfg.resume_allow_changes:  # the config's optimiser values, not the checkpoint's
        run.engine.retune(run.cfg.optim.optimizer)
    if distributed.is_main():
        write_config(run.run_dir, recorded(run.cfg, run.plan))


def train(run: Run) -> None:
    t = run.cfg.train
    if "eval_before" not in run.history:
        stats = run.data.stats
        run.writer.log(0, {**stats["train"].as_metrics("train"), **stats["eval"].as_metrics("eval")})
        run.history["eval_before"] = announced_evaluation(run, "before training") if t.eval_before else {}
        run.writer.log(0, run.history["eval_before"])
    start = time.perf_counter()
    total = run.plan.total_steps
    stop = preemption.install(run.run_dir)  # SIGUSR1, SIGTERM: finish the step, checkpoint, exit
    bar = tqdm(total=total, initial=run.step, desc=run.cfg.recipe_name,
               disable=not (run.cfg.logger.progress and distributed.is_main()), dynamic_ncols=True)
    while run.step < total:
        metrics = rm_step(run)
        run.step += 1
        if t.eval_every and run.step % t.eval_every == 0 and run.step < total:
            metrics.update(evaluate(run))
        run.writer.log(run.step, metrics)
        if distributed.is_main():
            log_step(log, run.step, total, metrics)
        bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc=f"{metrics['accuracy']:.2f}")
        bar.update()
        stopping = stop.agreed()  # every rank, once per step: a signal to any rank stops all after this step
        if stopping or t.checkpoint_every and (run.step % t.checkpoint_every == 0 or run.step == total):
            save_training_state(run.run_dir, run.engine,
                                {"step": run.step, "history": run.history, "sampler": run.data.sampler.state(),
                                 "metrics_rows": run.writer.rows}, keep=t.keep_checkpoints)
        if stopping:  # checkpointed: exit so the job is requeued (core/training/preemption.py)
            stop.exit(stopping, run.step)
    bar.close()
    run.history["train_seconds"] = run.history.get("train_seconds", 0.0) + time.perf_counter() - start
    run.history["eval_after"] = announced_evaluation(run, "after training", keep_rewards=True)
    run.writer.log(run.step, {k: v for k, v in run.history["eval_after"].items() if k != "rewards"})


def make_batch(run: Run, pairs: list[dict]) -> dict:
    """The pairs' tensors on the run's device, packed into one row or padded (``train.packing``)."""
    if run.cfg.train.packing:
        batch = RM.packed_batch(pairs)
    else:
        batch = RM.pair_batch(pairs, run.tokenizer.pad_token_id, run.cfg.train.padding_side)
    return {k: v.to(run.device) if torch.is_tensor(v) else v for k, v in batch.items()}


def rm_step(run: Run) -> dict:
    """One optimiser step over ``batch_size`` pairs, accumulated from micro-batches; their metrics add up on
    the device (float64) and reach the host once."""
    reset_peak_memory()  # memory/peak_mb is this step's
    t, engine, timer = run.cfg.train, run.engine, PhaseTimer()
    idx = run.data.sampler.next()[distributed.rank()::run.plan.world_size]
    micro, accum = t.micro_batch_size, run.plan.grad_accum
    sums = {}
    with timer.phase("update"):
        for u0 in range(0, len(idx), micro):
            batch = make_batch(run, [run.data.train_pairs[i] for i in idx[u0:u0 + micro]])
            r = engine.forward(RM.sequence_rewards, batch)  # [2 x micro]
            loss, m = RM.bt_loss(r, batch["margin"], t.loss)
            engine.backward(loss / accum)
            for k, v in {**m, "loss": loss.detach()}.items():
                sums[k] = sums.get(k, 0.0) + v.double() / accum
        sums = {**to_floats(sums), **engine.step()}  # no optimiser step on a non-finite gradient norm
    # this rank's pairs' loss and accuracy: the step's are the mean over ranks (equal shares); the peak, the largest
    out = distributed.mean_metrics({**sums, **timer.pop()}, peak_memory())
    bad = numerics.guard(run.step + 1, t.on_nonfinite, run.run_dir, {}, {k: out[k] for k in ("loss", "grad_norm")},
                         lambda: pair_records(run, idx))
    return {**out, **numerics.skip_metrics(t.on_nonfinite, bad)}


def pair_records(run: Run, idx: list[int]) -> list[dict]:
    """This rank's pairs of a step, as text, for the saved batch of a non-finite step (core/training/numerics.py)."""
    decode = run.tokenizer.decode
    return [{"pair": i, "chosen": decode(run.data.train_pairs[i]["chosen"]),
             "rejected": decode(run.data.train_pairs[i]["rejected"])} for i in idx]


def announced_evaluation(run: Run, when: str, keep_rewards: bool = False) -> dict:
    """:func:`evaluate`, announced in the log, then its pair accuracy and time."""
    with announced(log, f"evaluation on {len(run.data.eval_pairs)} held-out pairs ({when})") as said:
        out = evaluate(run, keep_rewards)
        said.append(f"pair accuracy {_fmt(out.get('eval/accuracy'))}")
    return out


@torch.no_grad()
def evaluate(run: Run, keep_rewards: bool = False) -> dict:
    """Held-out pair accuracy, loss, margin and reward mean/std over ``eval_pairs``, all of them on every rank:
    the numbers of one process, and under ZeRO-3 every rank runs the same forwards (each gathers layers)."""
    pairs = run.data.eval_pairs
    if not pairs:
        return {}
    t, rc, rr, margins, model = run.cfg.train, [], [], [], run.engine.module
    bs = t.eval_batch_size
    model.eval()
    for i in range(0, len(pairs), bs):
        batch = make_batch(run, pairs[i:i + bs])
        r = RM.sequence_rewards(model, batch)
        B = r.shape[0] // 2
        rc.append(r[:B]), rr.append(r[B:]), margins.append(batch["margin"])
    model.train()
    rc, rr, margin = torch.cat(rc), torch.cat(rr), torch.cat(margins)
    loss, m = RM.bt_loss(torch.cat([rc, rr]), margin, t.loss)
    stats = RM.reward_stats(torch.cat([rc, rr]))
    out = to_floats({**{f"eval/{k}": v for k, v in m.items()}, "eval/loss": loss})
    out.update({"eval/reward_mean": stats["mean"], "eval/reward_std": stats["std"]})
    if keep_rewards:
        out["rewards"] = stats
    return out


def save(run: Run) -> float:
    """Final Hugging Face RM (atomic, LoRA merged, reward mean/std inside) and one results row."""
    h, cfg, data = run.history, run.cfg, run.data
    with atomic_dir(run.run_dir / "model") as tmp:
        RM.save_reward_model(run.engine, run.tokenizer, tmp, h["eval_after"].get("rewards", {"mean": 0.0, "std": 1.0}),
                             run.backend.writable)
    run.writer.close()
    after, before = h["eval_after"], h["eval_before"]
    if not distributed.is_main():
        return float(after.get("eval/accuracy") or 0.0)
    row = {
        "recipe": cfg.recipe_name, "loop": "rm", "run_dir": str(run.run_dir), "seed": cfg.seed,
        "steps": run.step, "scale": cfg.scale.name, "eval_before": before.get("eval/accuracy"),
        "eval_after": after.get("eval/accuracy"), "eval_pairs": len(data.eval_pairs),
        "train_pairs": len(data.train_pairs), "reward_mean": after.get("eval/reward_mean"),
        "reward_std": after.get("eval/reward_std"), "train_seconds": round(h["train_seconds"], 2),
        "data": {s: st.as_metrics(s) for s, st in data.stats.items()}, "overrides": command_line_overrides(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    append_row(Path(cfg.paths.results_dir), row)
    write_summary(run.run_dir, row)  # the mark of a finished run, after its row
    log.info("held-out pair accuracy: before %s, after %s (%d pairs; %d steps, %.1f s); run dir %s",
             _fmt(row["eval_before"]), _fmt(row["eval_after"]), len(data.eval_pairs), run.step, h["train_seconds"],
             run.run_dir)
    return float(after.get("eval/accuracy") or 0.0)


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"
