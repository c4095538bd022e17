"""The learner half of an RL step (``recipes/rl.py`` ``rl_step``): the rollout-phase no-grad forwards, the KL in the
reward, and the optimiser steps over mini-batches of the rollout, each accumulated from micro-batches, the critic
stepping alongside the policy. ``python -m recipes.probe`` measures :func:`rollout_forwards` and :func:`micro_step`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from core.algorithms.advantage import value_mask
from core.algorithms.loss import AGGREGATIONS, AggContext, LossInput, compute_policy_loss, kl_penalty, masked_mean
from core.models.critic import chunked_values, token_values, value_loss
from core.models.logprobs import chunked_logprobs, response_logprobs
from core.reporting.metrics import to_floats
from core.rollout import RolloutBatch
from core.training import distributed

if TYPE_CHECKING:
    from recipes.rl import Run


@dataclass
class Forwards:
    """Rollout-phase no-grad forwards, each ``[N, R]`` or None when nothing needs it."""

    old: torch.Tensor | None  # trainer log-probs before the updates (PPO pi_old)
    ref: torch.Tensor | None  # reference policy log-probs
    values: torch.Tensor | None  # critic values (stored: V_old of the value clip)
    rollout: torch.Tensor | None  # sampler log-probs (the IS correction's denominator); None: not asked for


def rollout_forwards(run: Run, roll: RolloutBatch) -> Forwards:
    """Old-policy log-probs only when something needs them: several optimiser steps per rollout, an IS
    correction, or KL in the reward. Otherwise the policy has not moved at the first (only) step, so
    ``old = current.detach()`` exactly, as TRL does. Reference and critic forwards when those exist.
    All chunked by ``train.logprob_micro_batch_size`` (the sources' forward micro-batch knob)."""
    cfg, mb = run.cfg, run.cfg.train.logprob_micro_batch_size
    temp = 1.0 if cfg.rollout.greedy else cfg.rollout.temperature  # greedy: T = 1 log-probs
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
    micro, accum = t.micro_batch_size, run.plan.grad_accum
    N, sums, steps = roll.input_ids.shape[0], {}, 0
    for epoch in range(t.ppo_epochs):
        order = epoch_order(run, N, epoch)  # [N] rows in the order this epoch visits them
        for m0 in range(0, N, mini):
            tokens = distributed.all_sum(mask[order[m0:m0 + mini]].sum().double())  # the step's, all ranks
            agg = AggContext(num_micro_batches=accum, step_tokens=float(tokens),
                             world_size=run.plan.world_size, max_tokens=run.cfg.rollout.max_new_tokens)
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
    seed = run.cfg.seed * 1_000_003 + run.step * 1_009 + epoch + 7_919 * distributed.rank()
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen).to(run.device)  # [n]


def micro_step(run: Run, roll: RolloutBatch, sl: torch.Tensor, mask, adv, ret, fw: Forwards, agg: AggContext) -> dict:
    """Forward, loss and backward of one micro-batch (rows ``sl``) for the policy and, if present, the
    critic. Its metrics are detached tensors on the device (no host sync per micro-batch)."""
    cfg, engine = run.cfg, run.engine
    temp = 1.0 if cfg.rollout.greedy else cfg.rollout.temperature  # greedy: T = 1 log-probs
    ids, am, P = roll.input_ids[sl], roll.attention_mask[sl], roll.prompt_length
    lp, ent = engine.forward(response_logprobs, ids, am, P, temp, with_entropy=True,
                             entropy_grad=bool(cfg.loss.entropy_coef), packing=cfg.train.packing)
    inp = LossInput(lp, fw.old[sl] if fw.old is not None else lp.detach(), adv[sl], mask[sl],
                    fw.ref[sl] if fw.ref is not None else None, ent, fw.rollout[sl] if fw.rollout is not None else None)
    loss, metrics = compute_policy_loss(inp, cfg.loss, cfg.kl, agg, kl_coef=run.kl_ctl.beta)
    engine.backward(loss)
    metrics["loss"] = loss.detach().double() * agg.num_micro_batches
    if run.critic is not None:
        c = cfg.advantage.critic
        v = run.critic.forward(token_values, ids, am, P, cfg.train.packing)  # [n, R]
        vmask = value_mask(mask[sl], cfg.advantage)  # [n, R] where the returns live
        per_token = value_loss(v, fw.values[sl], ret[sl], c.clip)  # [n, R]
        vloss = c.coef * AGGREGATIONS.get(cfg.loss.aggregation)(per_token, vmask, agg)
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
