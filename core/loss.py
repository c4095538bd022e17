"""Policy losses, KL estimators and loss aggregations, each a registry keyed by config name.

``compute_policy_loss`` is the one call site: per-token policy loss (``loss.name``) plus the KL
penalty (``kl.estimator`` when ``kl.placement == "loss"``) minus the entropy bonus, reduced to a
scalar by ``loss.aggregation``. Adding a variant is one registered function and one YAML value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from core.registry import Registry


@dataclass
class LossInput:
    logprobs: torch.Tensor  # [N, R] current policy, with grad
    old_logprobs: torch.Tensor  # [N, R] policy that sampled the batch (behaviour policy)
    advantages: torch.Tensor  # [N, R]
    mask: torch.Tensor  # [N, R] 1 on tokens that count
    ref_logprobs: torch.Tensor | None = None  # [N, R] frozen reference policy
    entropy: torch.Tensor | None = None  # [N, R]


@dataclass
class AggContext:
    """What an aggregation may need beyond the micro-batch itself."""

    num_micro_batches: int = 1  # micro-batches accumulated into one optimiser step (x ranks)


PolicyLossFn = Callable[[LossInput, object], "tuple[torch.Tensor, dict[str, torch.Tensor]]"]
KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
AggFn = Callable[[torch.Tensor, torch.Tensor, AggContext], torch.Tensor]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")
AGGREGATIONS: Registry[AggFn] = Registry("loss aggregation")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(inp: LossInput, cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (Schulman et al. 2017, PPO eq. 7) with possibly asymmetric clip
    (``clip_low``, ``clip_high``; DAPO's clip-higher when ``clip_high > clip_low``):
    ``l_t = -min(rho_t A_t, clip(rho_t, 1 - clip_low, 1 + clip_high) A_t)``.
    """
    log_ratio = inp.logprobs - inp.old_logprobs  # [N, R]
    ratio = torch.exp(log_ratio)  # [N, R]
    lo, hi = 1.0 - float(cfg.clip_low), 1.0 + float(cfg.clip_high)
    unclipped = ratio * inp.advantages  # [N, R]
    clipped = torch.clamp(ratio, lo, hi) * inp.advantages  # [N, R]
    loss = -torch.minimum(unclipped, clipped)  # [N, R]
    is_clipped = ((ratio < lo) & (inp.advantages < 0)) | ((ratio > hi) & (inp.advantages > 0))  # [N, R]
    return loss, {"clip_frac": is_clipped.float(), "ratio": ratio.detach()}


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
    ``low_var_kl``): unbiased, low variance, >= 0."""
    d = ref_logp - logp  # [N, R]
    return torch.exp(d) - d - 1.0  # [N, R]


@AGGREGATIONS.register("token_mean")
def token_mean(x: torch.Tensor, mask: torch.Tensor, ctx: AggContext) -> torch.Tensor:
    """Token mean over the micro-batch, divided by the number of accumulated micro-batches
    (TRL ``bnpo``, veRL ``token-mean``, Open-Instruct)."""
    return (x * mask).sum() / mask.sum().clamp(min=1) / ctx.num_micro_batches


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def compute_policy_loss(inp: LossInput, loss_cfg, kl_cfg, ctx: AggContext):
    """Scalar loss for one micro-batch and detached per-micro-batch metrics (floats)."""
    per_token, extra = POLICY_LOSSES.get(loss_cfg.name)(inp, loss_cfg)  # [N, R]
    metrics = {k: masked_mean(v, inp.mask).item() for k, v in extra.items()}
    if inp.ref_logprobs is not None:
        kl = KL_ESTIMATORS.get(kl_cfg.estimator)(inp.logprobs, inp.ref_logprobs)  # [N, R]
        metrics["kl"] = masked_mean(kl.detach(), inp.mask).item()
        if kl_cfg.placement == "loss":
            per_token = per_token + float(kl_cfg.coef) * kl
    if inp.entropy is not None:
        metrics["entropy"] = masked_mean(inp.entropy.detach(), inp.mask).item()
        if float(loss_cfg.get("entropy_coef", 0.0)):
            per_token = per_token - float(loss_cfg.entropy_coef) * inp.entropy  # entropy bonus
    loss = AGGREGATIONS.get(loss_cfg.aggregation)(per_token, inp.mask, ctx)
    return loss, metrics
