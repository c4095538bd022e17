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

Placement (``core/training/device.py``): one device per rank, resolved before any model is built, holds
the policy, reference, critic and every tensor of a step; ``model.dtype=bfloat16`` trains in bf16 with
fp32 master weights. Under ZeRO-3 every model is built partitioned (``core.training.engine.model_init``).
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

from core.algorithms import shaping
from core.algorithms.advantage import AdvantageInput, compute_advantages, value_mask
from core.algorithms.kl_control import KLController
from core.algorithms.loss import AGGREGATIONS, AggContext, LossInput, compute_policy_loss, kl_penalty, masked_mean
from core.config.frozen import FrozenConfig
from core.config.pipeline import prepare, recorded
from core.config.plan import RLPlan, needs_reference
from core.config.resume import check_resume_config, write_config
from core.data import prompts as D
from core.models.critic import chunked_values, load_critic, token_values, value_loss
from core.models.loading import for_training, load_causal_lm, load_tokenizer, model_dir
from core.models.logprobs import chunked_logprobs, response_logprobs
from core.models.warm_start import warm_started_dir
from core.reporting.metrics import MetricsWriter, PhaseTimer, peak_memory, reset_peak_memory, to_floats
from core.reporting.results import append_row, write_summary
from core.rollout import RolloutBatch, Sampling, build_rollout
from core.rollout.ahead import GenerationAhead
from core.rollout.texts import REWARD_TEXTS
from core.training import distributed
from core.training.checkpoint import (AlreadyFinished, atomic_dir, load_training_state, prior_run,
                                     save_training_state, seed_everything)
from core.training.device import check_precision, resolve_device
from core.training.engine import FrozenModel, build_train_engine, model_init
from verifiers import get_verifier

log = logging.getLogger(__name__)


@dataclass
class Run:
    cfg: object
    run_dir: Path
    plan: RLPlan
    train_rows: list
    eval_rows: list
    train_ids: list
    eval_ids: list
    tokenizer: object
    device: torch.device
    engine: object
    ref: FrozenModel | None
    rollout: object
    verifier: object
    sampler: D.PromptSampler
    writer: MetricsWriter
    gen: GenerationAhead  # which weights generate which batch: rollout.generate_ahead (core/rollout/ahead.py)
    critic: object = None  # optimiser engine of the value model (advantage.critic), else None
    kl_ctl: KLController | None = None
    step: int = 0
    history: dict = field(default_factory=dict)


def main(cfg, run_dir: str | None = None) -> float:
    """Setup, train, save; returns the final greedy held-out accuracy (the sweep objective). ``cfg``: a
    composed config, or one prepared already (core/config/pipeline.py ``prepare``: recipes/run.py's).
    ``run_dir`` defaults to Hydra's run dir (given explicitly by tests that compose configs). A run dir
    that holds a finished run is not run again (``resume`` true or auto): its recorded objective returns."""
    try:
        run = setup(cfg, run_dir)
    except AlreadyFinished as done:
        log.info("%s already finished (%d steps); nothing to resume", done.summary["run_dir"], done.summary["steps"])
        return float(done.summary["eval_after"])
    train(run)
    return save(run)


def setup(cfg, run_dir: str | None = None) -> Run:
    prepared = prepare(cfg)  # scaled, checked, planned and frozen (core/config/pipeline.py): before anything else
    cfg = prepared.frozen
    device = resolve_device(cfg.device)  # before any model: a device or precision it cannot run fails here
    dtype = check_precision(cfg.model.dtype, device)
    rank, _ = distributed.init(device)
    seed_everything(int(cfg.seed), bool(cfg.deterministic))
    train_rows, eval_rows = D.load_split(cfg.data, "train"), D.load_split(cfg.data, "eval")
    plan = prepared.plan.for_rows(len(train_rows))  # a step's prompts fit in the data: before any model
    path = model_dir(cfg.model)
    tokenizer = load_tokenizer(path)
    train_rows, train_ids = D.tokenize_rows(train_rows, cfg.data, tokenizer)  # data.max_prompt_tokens applied
    eval_rows, eval_ids = D.tokenize_rows(eval_rows, cfg.data, tokenizer)
    plan = plan.for_rows(len(train_rows))  # train.epochs: passes over the rows data.max_prompt_tokens kept
    verifier = get_verifier(cfg.verifier.name)
    run_dir = Path(distributed.broadcast_object(str(run_dir or HydraConfig.get().runtime.output_dir)))
    prior = prior_run(run_dir, cfg.resume)  # before any model: what the dir holds must fit `resume`
    if prior.checkpoint is not None:
        check_resume_config(run_dir, recorded(cfg, plan))
    elif distributed.is_main():
        write_config(run_dir, recorded(cfg, plan))
    distributed.barrier()
    if int(cfg.train.warm_start.steps) > 0:
        answers = [r["answer"] for r in train_rows]
        path = str(warm_started_dir(path, cfg.model, cfg.train.warm_start, train_ids, answers, device, verifier,
                                    int(cfg.rollout.max_new_tokens)))
    total_updates = plan.total_optimizer_steps
    # ZeRO-3: every weight partitioned as it loads; the reference under its own config (zero.offload_reference)
    policy, ref, critic = load_models(cfg, path, lambda reference: model_init(cfg.zero, dtype, reference=reference))
    engine = _train_engine(policy, cfg, cfg.optim, total_updates, plan, device)
    if critic is not None:
        critic = _train_engine(critic, cfg, _critic_optim(cfg), total_updates, plan, device)
    rollout = build_rollout(cfg.rollout.engine, engine.module, tokenizer, cfg.rollout)
    run = Run(cfg, run_dir, plan, train_rows, eval_rows, train_ids, eval_ids, tokenizer, device, engine,
              FrozenModel(ref, cfg.zero, device) if ref is not None else None, rollout, verifier,
              D.PromptSampler(len(train_rows), int(cfg.train.prompts_per_step), int(cfg.seed)),
              MetricsWriter(run_dir, tensorboard=bool(cfg.logger.tensorboard), enabled=distributed.is_main(),
                            wandb=cfg.logger.wandb, config=cfg),
              gen=GenerationAhead(rollout, int(cfg.rollout.generate_ahead)), critic=critic, kl_ctl=KLController(cfg.kl))
    if rank:  # each rank samples its own completions; rank 0 keeps the single-process stream
        seed_everything(int(cfg.seed) + 1_000_003 * rank, bool(cfg.deterministic))
    if prior.checkpoint is not None:
        _resume(run, prior.checkpoint)
    else:
        run.writer.rewind(0, 0)  # resume=auto without a checkpoint: a killed attempt's records go
    return run


def load_models(cfg, path: str, placed=None):
    """``(policy, reference or None, critic or None)`` from ``path``, as the loop trains them (``python -m
    recipes.probe`` builds them the same way). ``placed(reference)`` is the context each is built in (the loop's
    :func:`core.training.engine.model_init`; the probe builds them whole). Train mode: transformers checkpoints
    gradients only there, and from_pretrained returns eval mode; the no-grad passes and generation switch to eval
    and back. The reference stays in eval (FrozenModel)."""
    placed = placed or (lambda reference: contextlib.nullcontext())
    with placed(False):
        policy = for_training(load_causal_lm(path, cfg.model), cfg.train.disable_dropout)
    with placed(True):
        ref = load_causal_lm(path, cfg.model) if needs_reference(cfg.kl) else None  # beta = 0: none at all
    with placed(False):
        critic = (for_training(load_critic(path, cfg.advantage.critic, cfg.model), cfg.train.disable_dropout)
                  if "critic" in cfg.advantage else None)
    return policy, ref, critic


def _train_engine(model, cfg, optim_cfg, total_updates: int, plan: RLPlan, device: torch.device):
    return build_train_engine(model, optim_cfg, cfg.zero, total_updates, plan.grad_accum,
                              int(cfg.train.micro_batch_size), device)


def _critic_optim(cfg) -> FrozenConfig:
    """The policy's optimiser settings with the critic's own learning rate (``advantage.critic.lr``)."""
    lr = float(cfg.advantage.critic.lr)
    return FrozenConfig({**cfg.optim, "optimizer": FrozenConfig({**cfg.optim.optimizer, "lr": lr})})


def _resume(run: Run, ckpt: Path) -> None:
    """Engines, RNG streams, step, history, sampler, KL beta and the batch generated ahead from ``ckpt``; the
    records cut back to what the checkpoint saw, so the steps after it are logged once, by this run."""
    state = load_training_state(ckpt, _Engines(run))
    run.step, run.history = state["step"], state["history"]
    run.gen.restore(state["local"], run.device)
    run.sampler.restore(state["sampler"])
    run.kl_ctl.beta = float(state["kl_beta"])
    run.writer.rewind(state["metrics_rows"], state["sample_rows"])
    if run.cfg.resume_allow_changes:  # the config's optimiser values, not the checkpoint's
        run.engine.retune(run.cfg.optim.optimizer)
        if run.critic is not None:
            run.critic.retune(_critic_optim(run.cfg).optimizer)
    if distributed.is_main():
        write_config(run.run_dir, recorded(run.cfg, run.plan))  # the resumed config (only keys a resume may change differ)


class _Engines:
    """The policy engine and, when there is one, the critic's: saved into one checkpoint folder."""

    def __init__(self, run: Run):
        self.run = run

    def save_state(self, out_dir) -> None:
        self.run.engine.save_state(out_dir)
        if self.run.critic is not None:
            (Path(out_dir) / "critic").mkdir(exist_ok=True)
            self.run.critic.save_state(Path(out_dir) / "critic")

    def load_state(self, out_dir) -> None:
        self.run.engine.load_state(out_dir)
        if self.run.critic is not None:
            self.run.critic.load_state(Path(out_dir) / "critic")


def train(run: Run) -> None:
    cfg, t = run.cfg, run.cfg.train
    if "eval_before" not in run.history:
        run.history["eval_before"] = evaluate(run)
        run.writer.log(0, {"eval/accuracy": run.history["eval_before"]})
    start = time.perf_counter()
    bar = tqdm(total=run.plan.total_steps, initial=run.step, desc=run.cfg.recipe_name,
               disable=not (cfg.logger.progress and distributed.is_main()), dynamic_ncols=True)
    while run.step < run.plan.total_steps:
        metrics = rl_step(run)
        run.step += 1
        if int(t.eval_every) and run.step % int(t.eval_every) == 0 and run.step < run.plan.total_steps:
            metrics["eval/accuracy"] = keep_best(run, evaluate(run))
        run.writer.log(run.step, metrics)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", acc=f"{metrics['accuracy']:.2f}",
                        kl=f"{metrics.get('kl', 0.0):.4f}")
        bar.update()
        if int(t.checkpoint_every) and run.step % int(t.checkpoint_every) == 0:
            save_training_state(run.run_dir / "checkpoint", _Engines(run),
                                {"step": run.step, "history": run.history, "sampler": run.sampler.state(),
                                 "kl_beta": run.kl_ctl.beta, "metrics_rows": run.writer.rows,
                                 "sample_rows": run.writer.sample_rows}, local=run.gen.state())
    bar.close()
    run.history["train_seconds"] = run.history.get("train_seconds", 0.0) + time.perf_counter() - start
    run.history["eval_after"] = keep_best(run, evaluate(run))
    run.writer.log(run.step, {"eval/accuracy": run.history["eval_after"]})


def rl_step(run: Run) -> dict:
    """One RL step: sample, score and shape, rollout-phase forwards, advantages, updates."""
    reset_peak_memory()  # memory/peak_mb is this step's
    cfg, G, timer = run.cfg, int(run.cfg.train.group_size), PhaseTimer()
    more = run.step + 1 < run.plan.total_steps  # a step follows: with generate_ahead its batch starts now
    # the batch generated one step ahead, else this step's generated now (core/rollout/ahead.py)
    idx, roll, made_by = run.gen.next_batch(run.engine, run.step, lambda: draw_prompts(run),
                                            Sampling.from_cfg(cfg.rollout), more, timer)
    rows = [run.train_rows[i] for i in idx]  # this rank's rows, group-major (a group may span ranks)
    with timer.phase("verify"):
        raw, valid, texts = score(run, roll, rows)  # [N], [N], N
    stopped = roll.stopped  # [N]
    log_samples(run, rows, texts, raw, valid, roll.finish_reason)
    # None rewards per train.shaping.none_reward, then the score-level shaping
    scores, mask = shaping.shape(raw, valid, roll.response_mask, stopped, int(cfg.rollout.max_new_tokens),
                                 cfg.train.shaping)  # [N], [N, R]
    with timer.phase("logprobs"):
        fw = rollout_forwards(run, roll)
    kl_reward, kl_metrics = in_reward_kl(run, fw, mask)  # [N, R] or None
    clip = cfg.train.shaping.reward_clip
    adv, ret = compute_advantages(AdvantageInput(scores, mask, G, fw.values, kl_reward,
                                                 tuple(clip) if clip else None), cfg.advantage)  # [N, R] x2
    with timer.phase("update"):
        upd = distributed.mean_metrics(update(run, roll, mask, adv, ret, fw))
    n_global = roll.input_ids.shape[0] * distributed.world()
    beta = run.kl_ctl.update(kl_metrics.get("kl_reward", upd.get("kl", 0.0)), n_global)
    # the whole step's rows, every rank's, for the logged statistics
    raw, scores, lengths, stopped = (distributed.gather_rows(x.float()) for x in
                                     (raw, scores, roll.response_lengths, stopped))
    valid = distributed.gather_rows(valid.float()).bool()
    tokens = distributed.all_sum(torch.stack([roll.response_mask.sum(), roll.attention_mask.sum()]).double())
    return {
        "reward/mean": raw[valid].mean().item(), "reward/std": raw[valid].std().item() if valid.sum() > 1 else 0.0,
        "reward/shaped_mean": scores[valid].mean().item(),
        "reward/skipped": int((~valid).sum()), "accuracy": (raw[valid] > 0).float().mean().item(),
        "length/mean": lengths.mean().item(), "length/max": lengths.max().item(),
        "length/truncated_frac": 1.0 - stopped.float().mean().item(), "kl/beta": beta,
        "tokens/generated": tokens[0].item(), "tokens/total": tokens[1].item(), **kl_metrics, **upd,
        "rollout/policy_lag": run.step - made_by,  # versions between the weights trained and those that sampled
        **distributed.mean_metrics(timer.pop()), **peak_memory(),
    }


def draw_prompts(run: Run) -> tuple[list[int], list[list[int]]]:
    """The next RL step's rows for this rank: their prompt indices and token ids, one per completion. The step's
    rows are group-major (G per prompt) and each rank takes its contiguous slice, so a group may span ranks (TRL's
    ``process_slice``; the group statistics gather them: core/algorithms/advantage.py)."""
    G = int(run.cfg.train.group_size)
    step_rows = [i for i in run.sampler.next() for _ in range(G)]
    idx = step_rows[distributed.own_rows(len(step_rows))]
    return idx, [run.train_ids[i] for i in idx]


def score(run: Run, roll: RolloutBatch, rows: list[dict], evaluation: bool = False):
    """Verifier rewards ``[N]``, a validity mask ``[N]`` (False where the verifier said None), on the run's
    device, and the decoded completions; ``evaluation``: by ``verifier.eval_name`` (with ``eval_kwargs``) when set."""
    texts, v = decode_responses(run.tokenizer, roll), run.cfg.verifier
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    fn, kwargs = (get_verifier(v.eval_name), v.eval_kwargs) if evaluation and v.eval_name else (run.verifier, v.kwargs)
    read = REWARD_TEXTS.get(v.text)(run.tokenizer, roll, texts)  # verifier.text: what it reads
    rewards = fn(read, **cols, **kwargs)
    valid = torch.tensor([r is not None for r in rewards], device=run.device)
    return torch.tensor([0.0 if r is None else float(r) for r in rewards], device=run.device), valid, texts


def log_samples(run: Run, rows: list[dict], texts: list[str], raw, valid, finish: list[str]) -> None:
    """Every ``logger.samples_every`` steps, ``logger.samples`` of this rank's completions, one per prompt
    group, with prompt, reward and finish reason (``samples.jsonl``, TensorBoard text)."""
    every, step = int(run.cfg.logger.samples_every), run.step + 1  # the step these rows will be logged as
    if not every or step % every:
        return
    G = int(run.cfg.train.group_size)
    picks = range(0, len(rows), G)[:int(run.cfg.logger.samples)]
    run.writer.samples(step, [{"prompt": rows[i]["prompt"], "completion": texts[i], "answer": rows[i].get("answer"),
                               "reward": raw[i].item() if valid[i] else None, "finish": finish[i]} for i in picks])


def decode_responses(tokenizer, roll: RolloutBatch) -> list[str]:
    ids = roll.response_ids.masked_fill(roll.response_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)


@dataclass
class Forwards:
    """Rollout-phase no-grad forwards, each ``[N, R]`` or None when nothing needs it."""

    old: torch.Tensor | None  # trainer log-probs before the updates (PPO pi_old)
    ref: torch.Tensor | None  # reference policy log-probs
    values: torch.Tensor | None  # critic values (stored: V_old of the value clip)
    rollout: torch.Tensor  # sampler log-probs (the IS correction's denominator)


def rollout_forwards(run: Run, roll: RolloutBatch) -> Forwards:
    """Old-policy log-probs only when something needs them: several optimiser steps per rollout, an IS
    correction, or KL in the reward. Otherwise the policy has not moved at the first (only) step, so
    ``old = current.detach()`` exactly, as TRL does. Reference and critic forwards when those exist.
    All chunked by ``train.logprob_micro_batch_size`` (the sources' forward micro-batch knob)."""
    cfg, mb = run.cfg, int(run.cfg.train.logprob_micro_batch_size)
    temp = 1.0 if cfg.rollout.greedy else float(cfg.rollout.temperature)  # greedy: T = 1 log-probs
    args = (roll.input_ids, roll.attention_mask, roll.prompt_length)
    is_mode = cfg.loss.is_correction.mode
    need_old = (run.plan.optimizer_steps_per_rl_step > 1 or is_mode != "none"
                or (run.ref is not None and cfg.kl.placement == "reward"))
    packing = cfg.train.packing
    return Forwards(
        old=chunked_logprobs(run.engine.module, *args, temp, mb, packing) if need_old else None,
        ref=chunked_logprobs(run.ref.module, *args, temp, mb, packing) if run.ref is not None else None,
        values=chunked_values(run.critic.module, *args, mb, packing) if run.critic is not None else None,
        rollout=roll.logprobs,
    )


def in_reward_kl(run: Run, fw: Forwards, mask) -> tuple[torch.Tensor | None, dict]:
    """``-beta KL_t(pi_old || pi_ref)`` per token when ``kl.placement == "reward"`` (OpenRLHF
    ``compute_reward``, Open-Instruct PPO ``non_score_reward``), else None."""
    if fw.ref is None or run.cfg.kl.placement != "reward":
        return None, {}
    kl = kl_penalty(fw.old, fw.ref, run.cfg.kl) * mask  # [N, R]
    sums = distributed.all_sum(torch.stack([kl.sum(), mask.sum()]).double())  # token mean over all ranks
    return -run.kl_ctl.beta * kl, {"kl_reward": (sums[0] / sums[1].clamp(min=1)).item()}


def update(run: Run, roll: RolloutBatch, mask, adv, ret, fw: Forwards) -> dict:
    """``ppo_epochs`` passes of mini-batch optimiser steps, each from ``grad_accum`` micro-batches;
    the critic (if any) steps alongside the policy on the same micro-batches (Open-Instruct PPO). The
    micro-batch metrics add up on the device (float64, as the floats did) and reach the host once, at the end."""
    t = run.cfg.train
    mini = run.plan.mini_batch_per_rank  # this rank's rows of one optimiser step
    micro, accum = int(t.micro_batch_size), run.plan.grad_accum
    N, sums, steps = roll.input_ids.shape[0], {}, 0
    for epoch in range(int(t.ppo_epochs)):
        order = epoch_order(run, N, epoch)  # [N] rows in the order this epoch visits them
        for m0 in range(0, N, mini):
            tokens = distributed.all_sum(mask[order[m0:m0 + mini]].sum().double())  # the step's, all ranks
            agg = AggContext(num_micro_batches=accum, step_tokens=float(tokens),
                             world_size=run.plan.world_size, max_tokens=int(run.cfg.rollout.max_new_tokens))
            for u0 in range(m0, m0 + mini, micro):
                m = micro_step(run, roll, order[u0:u0 + micro], mask, adv, ret, fw, agg)
                for k, v in m.items():
                    sums[k] = sums.get(k, 0.0) + v.double() / accum
            for k, v in engines_step(run).items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return to_floats({k: v / steps for k, v in sums.items()})


def epoch_order(run: Run, n: int, epoch: int) -> torch.Tensor:
    """Row order of one PPO epoch over this rank's rows: rollout order, or with
    ``train.shuffle_mini_batches`` a permutation drawn from its own generator seeded by (seed, rank, RL
    step, epoch), so the global RNG stream is untouched and a resumed run draws the same order (each
    learner permutes its local samples, as Open-Instruct does)."""
    if not run.cfg.train.shuffle_mini_batches:
        return torch.arange(n, device=run.device)  # [n]
    seed = int(run.cfg.seed) * 1_000_003 + run.step * 1_009 + epoch + 7_919 * distributed.rank()
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen).to(run.device)  # [n]


def micro_step(run: Run, roll: RolloutBatch, sl: torch.Tensor, mask, adv, ret, fw: Forwards, agg: AggContext) -> dict:
    """Forward, loss and backward of one micro-batch (rows ``sl``) for the policy and, if present, the
    critic. Its metrics are detached tensors on the device (no host sync per micro-batch)."""
    cfg, engine = run.cfg, run.engine
    temp = 1.0 if cfg.rollout.greedy else float(cfg.rollout.temperature)  # greedy: T = 1 log-probs
    ids, am, P = roll.input_ids[sl], roll.attention_mask[sl], roll.prompt_length
    lp, ent = engine.forward(response_logprobs, ids, am, P, temp, with_entropy=True,
                             entropy_grad=bool(cfg.loss.entropy_coef), packing=cfg.train.packing)
    inp = LossInput(lp, fw.old[sl] if fw.old is not None else lp.detach(), adv[sl], mask[sl],
                    fw.ref[sl] if fw.ref is not None else None, ent, fw.rollout[sl])
    loss, metrics = compute_policy_loss(inp, cfg.loss, cfg.kl, agg, kl_coef=run.kl_ctl.beta)
    engine.backward(loss)
    metrics["loss"] = loss.detach().double() * agg.num_micro_batches
    if run.critic is not None:
        c = cfg.advantage.critic
        v = run.critic.forward(token_values, ids, am, P, cfg.train.packing)  # [n, R]
        vmask = value_mask(mask[sl], cfg.advantage)  # [n, R] where the returns live
        per_token = value_loss(v, fw.values[sl], ret[sl], c.clip)  # [n, R]
        vloss = float(c.coef) * AGGREGATIONS.get(cfg.loss.aggregation)(per_token, vmask, agg)
        run.critic.backward(vloss)
        metrics["value/loss"] = vloss.detach().double() * agg.num_micro_batches
        metrics["value/mean"] = masked_mean(v.detach(), vmask)
    return metrics


def engines_step(run: Run) -> dict:
    """Optimiser step of the policy and, if present, of the critic (its own optimiser and LR)."""
    out = run.engine.step()
    if run.critic is not None:
        out.update({f"value/{k}": v for k, v in run.critic.step().items()})
    return out


@torch.no_grad()
def evaluate(run: Run) -> float:
    """Greedy accuracy on the held-out prompts (``train.eval_prompts`` of them; 0 = all), each rank
    scoring its share; correct and scored counts are summed over ranks."""
    n, world = int(run.cfg.train.eval_prompts) or len(run.eval_rows), distributed.world()
    share = slice(distributed.rank(), n, world)
    rows, ids = run.eval_rows[:n][share], run.eval_ids[:n][share]
    counts = torch.zeros(2, dtype=torch.float64)  # [correct, scored]
    run.gen.push(run.engine, run.step)  # settles a generation in flight first; collective under ZeRO-3
    with run.engine.gathered(run.rollout.gathers_policy):  # collective under ZeRO-3: every rank enters, rows or not
        if run.rollout.collective:  # as many prompts as every other rank (so as many synced generate chunks):
            ids = ids + run.eval_ids[:1] * (-(-n // world) - len(ids))  # stand-ins fill a short share, then go
        if ids:
            roll = run.rollout.generate(ids, Sampling.from_cfg(run.cfg.rollout, greedy=True)).head(len(rows))
        if rows:
            scores, valid, _ = score(run, roll, rows, evaluation=True)
            counts += torch.tensor([float(((scores > 0) & valid).sum()), float(valid.sum())], dtype=torch.float64)
    correct, scored = distributed.all_sum(counts).tolist()
    return correct / scored if scored else float("nan")


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
        "recipe": cfg.recipe_name, "run_dir": str(run.run_dir), "seed": int(cfg.seed), "steps": run.step,
        "scale": cfg.scale.name, "eval_before": h["eval_before"], "eval_after": h["eval_after"],
        "train_seconds": round(h["train_seconds"], 2), "overrides": _overrides(),
        **({"best_step": h["best"]["step"], "eval_best": h["best"]["accuracy"]} if "best" in h else {}),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    append_row(Path(cfg.paths.results_dir), row)
    write_summary(run.run_dir, row)
    log.info("greedy held-out accuracy: before RL %.3f, after RL %.3f (%d steps, %.1f s); run dir %s",
             h["eval_before"], h["eval_after"], run.step, h["train_seconds"], run.run_dir)
    return h["eval_after"] if not math.isnan(h["eval_after"]) else 0.0


def _overrides() -> list[str]:
    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []
