"""Policy losses, importance corrections, KL estimators and loss aggregations: registries keyed by
config name.

``compute_policy_loss`` is the one call site: per-token policy loss (``loss.name``), times the
sampler/trainer importance weight (``loss.is_correction.mode``), plus the KL penalty
(``kl.estimator`` when ``kl.placement == "loss"``), minus the entropy bonus, reduced to a scalar by
``loss.aggregation``. Adding a variant is one registered function and one YAML value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.registry import Registry


@dataclass
class LossInput:
    logprobs: torch.Tensor  # [N, R] current policy, with grad
    old_logprobs: torch.Tensor  # [N, R] trainer's policy before this RL step's updates (PPO pi_old)
    advantages: torch.Tensor  # [N, R]
    mask: torch.Tensor  # [N, R] 1 on tokens that count
    ref_logprobs: torch.Tensor | None = None  # [N, R] frozen reference policy
    entropy: torch.Tensor | None = None  # [N, R]
    rollout_logprobs: torch.Tensor | None = None  # [N, R] sampler's log-probs, for IS correction; None: not asked for


@dataclass
class AggContext:
    """What an aggregation may need beyond the micro-batch itself (known before the micro-batch loop)."""

    num_micro_batches: int = 1  # micro-batches accumulated into one optimiser step on this rank
    step_tokens: float = 0.0  # active tokens of the whole optimiser step, all micro-batches, all ranks
    world_size: int = 1  # data-parallel ranks (DDP/ZeRO average gradients over them)
    max_tokens: int = 1  # constant length normaliser (max completion length; Dr. GRPO)


PolicyLossFn = Callable[[LossInput, object], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
ISFn = Callable[[LossInput, object], "torch.Tensor | None"]
KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
AggFn = Callable[[torch.Tensor, torch.Tensor, AggContext], torch.Tensor]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
IS_CORRECTIONS: Registry[ISFn] = Registry("importance correction")
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")
AGGREGATIONS: Registry[AggFn] = Registry("loss aggregation")


# ----------------------------------------------------------------------------------- policy losses
def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, cfg):
    """``-min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)``, with dual clip ``-max(., c A)`` for
    ``A < 0`` when ``cfg.dual_clip = c > 1`` (Ye et al. 2019, arXiv 1912.09729; OpenRLHF
    ``models/loss.py::PolicyLoss``, veRL ``clip_ratio_c``). Returns ``(loss [N, R], clipped [N, R])``."""
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    surr1 = ratio * adv  # [N, R]
    surr2 = torch.clamp(ratio, lo, hi) * adv  # [N, R]
    clip1 = torch.minimum(surr1, surr2)  # [N, R]
    clipped = surr2 < surr1  # [N, R] OpenRLHF ppo_clip_ratio
    c = cfg.dual_clip
    if c:
        clip3 = torch.maximum(clip1, c * adv)  # [N, R]
        clipped = clipped | ((adv < 0) & (clip3 > clip1))  # [N, R]
        clip1 = torch.where(adv < 0, clip3, clip1)  # [N, R]
    return -clip1, clipped


def exp_log_ratio(log_ratio: torch.Tensor, cfg) -> torch.Tensor:
    """``exp(log_ratio)`` with the log ratio first clamped to ``+-cfg.log_ratio_clamp`` when set, so one
    token far off-policy cannot overflow ``exp`` (a clamped entry has zero gradient). veRL clamps at 20
    (``trainer/ppo/core_algos.py::compute_policy_loss_vanilla`` @b178a3c, since 2c85b43 / v0.4.1), OpenRLHF
    too (``models/loss.py::PolicyLoss``, ``ppo`` only, @3c3be62, since df78645e / v0.10.3); TRL
    (``grpo_trainer.py::_compute_loss``, 0.18 and 1.16), Open-Instruct and the SimpleRL veRL fork do not."""
    c = cfg.log_ratio_clamp
    return torch.exp(log_ratio.clamp(-c, c) if c else log_ratio)


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(inp: LossInput, cfg):
    """Token-level clipped surrogate (Schulman et al. 2017, PPO eq. 7); clip-higher (DAPO, Yu et al.
    2025) when ``clip_high > clip_low``; optional dual clip. ``rho_t = exp(logp - logp_old)``."""
    ratio = exp_log_ratio(inp.logprobs - inp.old_logprobs, cfg)  # [N, R]
    loss, clipped = clipped_surrogate(ratio, inp.advantages, cfg)  # [N, R]
    return loss, {"clip_frac": clipped.float(), "ratio": ratio.detach()}


@POLICY_LOSSES.register("gspo")
def gspo(inp: LossInput, cfg):
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): the sequence ratio ``exp(mean_t (logp - logp_old))``
    broadcast to every token, with a straight-through per-token gradient as TRL
    (``importance_sampling_level="sequence"``) and OpenRLHF (``policy_loss_type gspo``) compute it.
    ``log_ratio_clamp`` bounds the sequence mean (neither of those clamps it; veRL's ``gspo`` caps the
    log ratio above at 10 only)."""
    m = inp.mask.float()  # [N, R]
    log_ratio = inp.logprobs - inp.old_logprobs  # [N, R]
    seq = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)  # [N, 1]
    ratio = exp_log_ratio(seq, cfg).expand_as(log_ratio)  # [N, R]
    loss, clipped = clipped_surrogate(ratio, inp.advantages, cfg)  # [N, R]
    return loss, {"clip_frac": clipped.float(), "ratio": ratio.detach()}


# ----------------------------------------------------------------------------------- IS correction
def _is_log_weight(inp: LossInput) -> torch.Tensor:
    """``log w = logp_old(trainer) - logp(sampler)``. Without the sampler's log-probs there is no weight to take: a
    weight of 1 would pass for a correction that never ran, so it is refused."""
    if inp.rollout_logprobs is None:
        raise ValueError("loss.is_correction needs the sampler's log-probs (LossInput.rollout_logprobs), and this "
                         "rollout has none: the loop asks the engine for them when loss.is_correction.mode is not "
                         "none (RLPlan.rollout_logprobs)")
    return (inp.old_logprobs - inp.rollout_logprobs).detach() * inp.mask  # [N, R]


def _seq(logw: torch.Tensor) -> torch.Tensor:
    return logw.sum(-1, keepdim=True).expand_as(logw)  # [N, R] TRL: summed log-weight per sequence


@IS_CORRECTIONS.register("none")
def is_none(inp: LossInput, cfg):
    return None


@IS_CORRECTIONS.register("token_truncate")
def is_token_truncate(inp: LossInput, cfg):
    """Truncated IS (TIS; TRL ``token_truncate``, OpenRLHF TIS): ``w = clamp(exp(log w), low, high)``."""
    return torch.exp(_is_log_weight(inp)).clamp(cfg.low or 0.0, cfg.high)  # [N, R]


@IS_CORRECTIONS.register("token_mask")
def is_token_mask(inp: LossInput, cfg):
    """Masked IS (TRL ``token_mask``, OpenRLHF ``icepop``): ``w`` zeroed outside ``[low, high]``."""
    w = torch.exp(_is_log_weight(inp))  # [N, R]
    return w * ((w >= (cfg.low or 0.0)) & (w <= cfg.high))  # [N, R]


@IS_CORRECTIONS.register("sequence_truncate")
def is_sequence_truncate(inp: LossInput, cfg):
    """TRL ``sequence_truncate``: per-sequence weight ``exp(sum_t log w)`` clamped to ``[low, high]``."""
    return torch.exp(_seq(_is_log_weight(inp))).clamp(cfg.low or 0.0, cfg.high)  # [N, R]


@IS_CORRECTIONS.register("sequence_mask")
def is_sequence_mask(inp: LossInput, cfg):
    """TRL ``sequence_mask`` (default at ``huggingface/trl@f2cd577``): per-sequence weight zeroed
    outside ``[low, high]``."""
    w = torch.exp(_seq(_is_log_weight(inp)))  # [N, R]
    return w * ((w >= (cfg.low or 0.0)) & (w <= cfg.high))  # [N, R]


@IS_CORRECTIONS.register("sequence_geo_mask")
def is_sequence_geo_mask(inp: LossInput, cfg):
    """OpenRLHF ``seq-mask-tis``: token weights kept, whole sequence masked when the geometric-mean
    weight ``exp(mean_t log w)`` is outside ``[low, high]``."""
    logw = _is_log_weight(inp)  # [N, R]
    m = inp.mask.float()  # [N, R]
    geo = torch.exp((logw * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1))  # [N, 1]
    keep = (geo >= (cfg.low or 0.0)) & (geo <= cfg.high)  # [N, 1]
    return torch.exp(logw) * keep  # [N, R]


# ----------------------------------------------------------------------------------- KL estimators
@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_ref`` (Schulman, "Approximating KL divergence", 2020): unbiased, high variance."""
    return logp - ref_logp  # [N, R]


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``(log pi - log pi_ref)^2 / 2`` (Schulman 2020): biased, low variance, >= 0."""
    return 0.5 * (logp - ref_logp) ** 2  # [N, R]


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``exp(d) - d - 1`` with ``d = log pi_ref - log pi`` (Schulman 2020; TRL GRPO, veRL
    ``low_var_kl``, OpenRLHF/Open-Instruct kl3 ``exp(-r) - 1 + r``): unbiased, low variance, >= 0."""
    d = ref_logp - logp  # [N, R]
    # expm1(d) - d equals exp(d) - d - 1 but without the cancellation that makes it slightly
    # negative (-1e-16) for |d| ~ 1e-12; the sources' form differs only in that rounding.
    return torch.expm1(d) - d  # [N, R]


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kl_cfg) -> torch.Tensor:
    """The estimator ``kl_cfg.estimator`` with the sources' clamps: ``log_ratio_clamp`` bounds
    ``log pi - log pi_ref`` first (Open-Instruct grpo_fast 40, upstream veRL k3 20), ``clamp`` bounds
    the result (OpenRLHF >= v0.8.6 and the SimpleRL veRL fork's k3: 10). null = no clamp (TRL)."""
    lr_clamp, out_clamp = kl_cfg.log_ratio_clamp, kl_cfg.clamp
    if lr_clamp:
        logp = ref_logp + (logp - ref_logp).clamp(-lr_clamp, lr_clamp)  # [N, R]
    kl = KL_ESTIMATORS.get(kl_cfg.estimator)(logp, ref_logp)  # [N, R]
    return kl.clamp(-out_clamp, out_clamp) if out_clamp else kl  # [N, R]


# ----------------------------------------------------------------------------------- aggregations
@AGGREGATIONS.register("token_mean", accumulation_exact=False)
def token_mean(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Token mean over the micro-batch, divided by the number of accumulated micro-batches
    (TRL ``bnpo``, the SimpleRL veRL fork ``dp_actor``, Open-Instruct grpo_fast @686a521a,
    OpenRLHF v0.7-v0.10.3). Not equal to one big batch when micro-batches differ in token count."""
    return (x * mask).sum() / mask.sum().clamp(min=1) / ctx.num_micro_batches


@AGGREGATIONS.register("token_mean_global", accumulation_exact=True)
def token_mean_global(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Token sum over the step's total active tokens (all micro-batches, all ranks), times world size
    to cancel the data-parallel gradient average: a token mean over the whole optimiser step
    (TRL ``dapo``; OpenRLHF >= v0.10.4 #1249; Open-Instruct ``loss_denominator="token"``)."""
    return (x * mask).sum() * ctx.world_size / max(float(ctx.step_tokens), 1.0)


@AGGREGATIONS.register("seq_mean_token_mean", accumulation_exact=True)
def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean, divided by accumulation steps (original
    GRPO, TRL ``grpo``, OpenRLHF <= v0.6, veRL ``seq-mean-token-mean`` of its new engine, which divides
    by the mini-batch's rows). Length-biased. Rows without loss tokens count (as zeros)."""
    per_seq = (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    return per_seq.mean() / ctx.num_micro_batches


@AGGREGATIONS.register("seq_mean_token_mean_nonempty", accumulation_exact=False)
def seq_mean_token_mean_nonempty(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """``seq_mean_token_mean`` over the rows that have loss tokens: a fully masked row (a truncated
    completion under ``mask_truncated``) leaves the denominator, where ``seq_mean_token_mean`` counts it
    as a zero. veRL's ``agg_loss`` ``seq-mean-token-mean`` per micro-batch (legacy worker, its default,
    @b178a3c, since 4424616 / v0.6.1); OpenRLHF's ``aggregate_loss`` for ``gspo`` (@3c3be62, since
    v0.10.3) counts the non-empty rows of the whole step and all ranks, the same when every micro-batch
    holds as many. Not one big batch when micro-batches hold different numbers of empty rows."""
    tokens = mask.sum(-1)  # [N]
    per_seq = (x * mask).sum(-1) / tokens.clamp(min=1)  # [N]
    return per_seq.sum() / (tokens > 0).sum().clamp(min=1) / ctx.num_micro_batches


@AGGREGATIONS.register("token_sum_norm", accumulation_exact=True)
def token_sum_norm(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Token sum over ``rows x max_tokens`` (a constant), divided by accumulation steps: Dr. GRPO
    (TRL ``dr_grpo``, veRL ``seq-mean-token-sum-norm``); max_tokens = max completion length."""
    return (x * mask).sum() / (x.shape[0] * ctx.max_tokens) / ctx.num_micro_batches


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def compute_policy_loss(inp: LossInput, loss_cfg, kl_cfg, ctx: AggContext, kl_coef: float | None = None):
    """Scalar loss for one micro-batch and its metrics as detached scalar tensors on the loss's device: a
    ``.item()`` here would wait for the GPU every micro-batch; the loop turns them into floats once a step.

    ``kl_coef`` is the controller's current beta (defaults to ``kl_cfg.coef``). The importance weight
    multiplies the policy term before the KL is added, as TRL does."""
    per_token, extra = POLICY_LOSSES.get(loss_cfg.name)(inp, loss_cfg)  # [N, R]
    is_cfg = loss_cfg.is_correction
    w = IS_CORRECTIONS.get(is_cfg["mode"])(inp, is_cfg)  # [N, R] or None
    if w is not None:
        per_token = per_token * w  # [N, R]
        extra["is_weight"] = w
    metrics = {k: masked_mean(v.float(), inp.mask).detach() for k, v in extra.items()}
    if inp.ref_logprobs is not None:
        kl = kl_penalty(inp.logprobs, inp.ref_logprobs, kl_cfg)  # [N, R]
        metrics["kl"] = masked_mean(kl.detach(), inp.mask)
        if kl_cfg.placement == "loss":
            per_token = per_token + (kl_cfg.coef if kl_coef is None else kl_coef) * kl  # [N, R]
    coef = loss_cfg.entropy_coef
    if inp.entropy is not None:
        metrics["entropy"] = masked_mean(inp.entropy.detach(), inp.mask)
        if coef:
            per_token = per_token - coef * inp.entropy  # [N, R] entropy bonus
    loss = AGGREGATIONS.get(loss_cfg.aggregation)(per_token, inp.mask, ctx)
    return loss, metrics
