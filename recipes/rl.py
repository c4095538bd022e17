"""On-policy RL loop (GRPO family): setup, train, save.

One RL step: sample ``prompts_per_step x group_size`` completions, score them with the verifier,
compute advantages, then take PPO-style optimiser steps over mini-batches of the rollout, each
accumulated from micro-batches. Everything algorithmic is a registry lookup in ``core/``.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from tqdm import tqdm

from core import data as D
from core import validate
from core.advantage import ADVANTAGES, AdvantageInput
from core.checkpoint import load_training_state, save_training_state, seed_everything
from core.loss import AggContext, LossInput, compute_policy_loss
from core.metrics import MetricsWriter, PhaseTimer, peak_memory_mb
from core.models import load_causal_lm, load_tokenizer, model_dir
from core.policy import chunked_logprobs, response_logprobs
from core.results import append_row
from core.rollout import Rollout, Sampling, build_engine
from core.scale import apply_scale
from core.sft import warm_started_dir
from core.zero import build_engine as build_optim_engine
from verifiers import get_verifier

log = logging.getLogger(__name__)


@dataclass
class Run:
    cfg: object
    run_dir: Path
    plan: dict
    train_rows: list
    eval_rows: list
    train_ids: list
    eval_ids: list
    tokenizer: object
    engine: object
    ref: object
    rollout: object
    verifier: object
    sampler: D.PromptSampler
    writer: MetricsWriter
    step: int = 0
    history: dict = field(default_factory=dict)


def main(cfg) -> float:
    """Setup, train, save; returns the final greedy held-out accuracy (the sweep objective)."""
    run = setup(cfg)
    train(run)
    return save(run)


def setup(cfg) -> Run:
    cfg = apply_scale(cfg)
    seed_everything(int(cfg.seed))
    train_rows, eval_rows = D.load_split(cfg.data, "train"), D.load_split(cfg.data, "eval")
    plan = validate.check_rl(cfg, world_size=1, num_train_rows=len(train_rows))  # before any model
    verifier = get_verifier(cfg.verifier.name)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    path = model_dir(cfg.model)
    tokenizer = load_tokenizer(path)
    train_ids = [D.tokenize_prompt(r["prompt"], cfg.data, tokenizer) for r in train_rows]
    eval_ids = [D.tokenize_prompt(r["prompt"], cfg.data, tokenizer) for r in eval_rows]
    if int(cfg.train.warm_start.steps) > 0:
        path = str(warm_started_dir(path, cfg.model, cfg.train.warm_start, train_ids,
                                    [r["answer"] for r in train_rows]))
    model = load_causal_lm(path, cfg.model)
    ref = _frozen_copy(model) if float(cfg.kl.coef) > 0 else None  # k = 0: no reference at all
    total_updates = int(cfg.train.total_steps) * plan["optimizer_steps_per_rl_step"]
    engine = build_optim_engine(model, cfg.optim, cfg.zero, total_updates, plan["grad_accum"],
                                int(cfg.train.micro_batch_size))
    run = Run(cfg, run_dir, plan, train_rows, eval_rows, train_ids, eval_ids, tokenizer, engine, ref,
              build_engine(cfg.rollout.engine, engine.module, tokenizer, cfg.rollout), verifier,
              D.PromptSampler(len(train_rows), int(cfg.train.prompts_per_step), int(cfg.seed)),
              MetricsWriter(run_dir, tensorboard=bool(cfg.logger.tensorboard)))
    _maybe_resume(run)
    return run


def _frozen_copy(model):
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _maybe_resume(run: Run) -> None:
    ckpt = run.run_dir / "checkpoint"
    if run.cfg.resume and (ckpt / "trainer.json").exists():
        state = load_training_state(ckpt, run.engine)
        run.step, run.history = state["step"], state["history"]
        run.sampler.restore(state["sampler"])


def train(run: Run) -> None:
    cfg, t = run.cfg, run.cfg.train
    if "eval_before" not in run.history:
        run.history["eval_before"] = evaluate(run)
        run.writer.log(0, {"eval/accuracy": run.history["eval_before"]})
    start = time.perf_counter()
    bar = tqdm(total=int(t.total_steps), initial=run.step, desc=run.cfg.recipe_name,
               disable=not cfg.logger.progress, dynamic_ncols=True)
    while run.step < int(t.total_steps):
        metrics = rl_step(run)
        run.step += 1
        if int(t.eval_every) and run.step % int(t.eval_every) == 0 and run.step < int(t.total_steps):
            metrics["eval/accuracy"] = evaluate(run)
        run.writer.log(run.step, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}",
                        kl=f"{metrics.get('kl', 0.0):.4f}")
        bar.update()
        if int(t.checkpoint_every) and run.step % int(t.checkpoint_every) == 0:
            save_training_state(run.run_dir / "checkpoint", run.engine,
                                {"step": run.step, "history": run.history, "sampler": run.sampler.state()})
    bar.close()
    run.history["train_seconds"] = run.history.get("train_seconds", 0.0) + time.perf_counter() - start
    run.history["eval_after"] = evaluate(run)
    run.writer.log(run.step, {"eval/accuracy": run.history["eval_after"]})


def rl_step(run: Run) -> dict:
    cfg, G, timer = run.cfg, int(run.cfg.train.group_size), PhaseTimer()
    idx = run.sampler.next()
    rows = [run.train_rows[i] for i in idx for _ in range(G)]  # group-major: G consecutive rows per prompt
    with timer.phase("generate"):
        roll = run.rollout.generate([run.train_ids[i] for i in idx for _ in range(G)],
                                    Sampling.from_cfg(cfg.rollout))
    with timer.phase("verify"):
        scores, valid = score(run, roll, rows)  # [N], [N]
    mask = roll.response_mask * valid.unsqueeze(-1)  # [N, R] skipped samples (None reward) drop out
    with timer.phase("logprobs"):
        old, ref = reference_logprobs(run, roll)
    adv, _ = ADVANTAGES.get(cfg.advantage.name)(AdvantageInput(scores, mask, G), cfg.advantage)  # [N, R]
    with timer.phase("update"):
        upd = update(run, roll, mask, adv, old, ref)
    lengths = roll.response_lengths.float()
    return {
        "reward/mean": scores[valid].mean().item(), "reward/std": scores[valid].std().item() if valid.sum() > 1 else 0.0,
        "reward/skipped": int((~valid).sum()), "accuracy": (scores[valid] > 0).float().mean().item(),
        "length/mean": lengths.mean().item(), "length/max": lengths.max().item(),
        "length/truncated_frac": sum(r == "length" for r in roll.finish_reason) / len(roll.finish_reason),
        **upd, **timer.pop(), "memory/peak_mb": peak_memory_mb(),
    }


def score(run: Run, roll: Rollout, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Verifier rewards ``[N]`` and a validity mask ``[N]`` (False where the verifier said None)."""
    texts = decode_responses(run.tokenizer, roll)
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    rewards = run.verifier(texts, **cols, **run.cfg.verifier.get("kwargs", {}))
    valid = torch.tensor([r is not None for r in rewards])
    return torch.tensor([0.0 if r is None else float(r) for r in rewards]), valid


def decode_responses(tokenizer, roll: Rollout) -> list[str]:
    ids = roll.response_ids.masked_fill(roll.response_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


def reference_logprobs(run: Run, roll: Rollout):
    """Old-policy log-probs (only when a rollout feeds several optimiser steps; with one step the
    policy has not moved, so ``old = current.detach()`` exactly, as TRL does) and reference ones."""
    t, temp = run.cfg.train, float(run.cfg.rollout.temperature) or 1.0
    old = None
    if run.plan["optimizer_steps_per_rl_step"] > 1:
        old = chunked_logprobs(run.engine.module, roll.input_ids, roll.attention_mask, roll.prompt_length,
                               temp, int(t.logprob_micro_batch_size))
    ref = None
    if run.ref is not None:
        ref = chunked_logprobs(run.ref, roll.input_ids, roll.attention_mask, roll.prompt_length, temp,
                               int(t.logprob_micro_batch_size))
    return old, ref


def update(run: Run, roll: Rollout, mask, adv, old, ref) -> dict:
    """``ppo_epochs`` passes of mini-batch optimiser steps, each from ``grad_accum`` micro-batches."""
    t, engine = run.cfg.train, run.engine
    mini, micro, accum = int(t.mini_batch_size), int(t.micro_batch_size), run.plan["grad_accum"]
    temp = float(run.cfg.rollout.temperature) or 1.0
    N, agg = roll.input_ids.shape[0], AggContext(num_micro_batches=accum)
    sums, steps = {}, 0
    for _ in range(int(t.ppo_epochs)):
        for m0 in range(0, N, mini):
            for u0 in range(m0, m0 + mini, micro):
                sl = slice(u0, u0 + micro)
                lp, ent = response_logprobs(engine.module, roll.input_ids[sl], roll.attention_mask[sl],
                                            roll.prompt_length, temp, with_entropy=True)
                inp = LossInput(lp, (old[sl] if old is not None else lp.detach()), adv[sl], mask[sl],
                                ref[sl] if ref is not None else None, ent)
                loss, m = compute_policy_loss(inp, run.cfg.loss, run.cfg.kl, agg)
                engine.backward(loss)
                for k, v in {**m, "loss": loss.item() * accum}.items():
                    sums[k] = sums.get(k, 0.0) + v / accum
            for k, v in engine.step().items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


@torch.no_grad()
def evaluate(run: Run) -> float:
    """Greedy accuracy on the held-out prompts (``train.eval_prompts`` of them; 0 = all)."""
    n = int(run.cfg.train.eval_prompts) or len(run.eval_rows)
    rows, ids = run.eval_rows[:n], run.eval_ids[:n]
    if not rows:
        return float("nan")
    roll = run.rollout.generate(ids, Sampling.from_cfg(run.cfg.rollout, greedy=True))
    scores, valid = score(run, roll, rows)
    return (scores[valid] > 0).float().mean().item() if valid.any() else float("nan")


def save(run: Run) -> float:
    """Final Hugging Face checkpoint (atomic) and one summary row in the results table."""
    from core.checkpoint import atomic_dir

    with atomic_dir(run.run_dir / "model") as tmp:
        run.engine.save_pretrained(tmp, run.tokenizer)
    run.writer.close()
    h, cfg = run.history, run.cfg
    row = {
        "recipe": cfg.recipe_name, "run_dir": str(run.run_dir), "seed": int(cfg.seed), "steps": run.step,
        "scale": cfg.scale.name, "eval_before": h["eval_before"], "eval_after": h["eval_after"],
        "train_seconds": round(h["train_seconds"], 2), "overrides": _overrides(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    (run.run_dir / "summary.json").write_text(json.dumps(row, indent=1))
    append_row(Path(cfg.paths.results_dir), row)
    log.info("greedy held-out accuracy: before RL %.3f, after RL %.3f (%d steps, %.1f s); run dir %s",
             h["eval_before"], h["eval_after"], run.step, h["train_seconds"], run.run_dir)
    return h["eval_after"] if not math.isnan(h["eval_after"]) else 0.0


def _overrides() -> list[str]:
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []
